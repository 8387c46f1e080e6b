//! Panics caught and quoted: the harness runs every check's cases, and check 7's calls, under
//! [`catch`], so a panicking op, kernel, backend or case generator fails its report with the
//! panic's message and location (`file:line`) instead of ending the test program.
//!
//! A caught panic is not printed: the first guarded call installs, once, a panic hook that
//! stays silent for a panic on a thread inside a guarded call (a thread-local flag) and hands
//! every other panic to the hook that was there before, unchanged. Tests running in parallel
//! thus print their panics as before, and an op that panics on every case does not print
//! thousands of messages and backtraces while its failure is shrunk.
//!
//! A call that does not return (an op or backend in an infinite loop or a deadlock) cannot be
//! caught: the outermost guarded call on each thread is watched by [`crate::watchdog`], which
//! ends the process with a message naming the check and the case, and exit status
//! [`crate::watchdog::EXIT_STATUS`], once a case runs past the case timeout (`TL_CASE_TIMEOUT`,
//! 600 s by default).

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::panic::{self, AssertUnwindSafe};
use std::sync::Once;

/// What a guarded call gave: the call's own result, or the message of its panic.
pub(crate) type Guarded<R> = Result<Result<R, String>, String>;

thread_local! {
    /// Whether this thread is inside [`catch`] (its panics are caught and reported there).
    static GUARDED: Cell<bool> = const { Cell::new(false) };
    /// Where this thread's last caught panic happened, as the hook saw it.
    static PANIC_AT: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Install, once, the hook that keeps a guarded thread's panics quiet (see the module
/// documentation) and passes every other panic to the previous hook.
fn quiet_hook() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if GUARDED.with(Cell::get) {
                let at = info.location().map(ToString::to_string);
                PANIC_AT.with(|p| *p.borrow_mut() = at);
            } else {
                previous(info);
            }
        }));
    });
}

/// Run `f`, catching a panic: `Err` with its message, quoted, and its location. The outermost
/// call on a thread is watched for the case timeout ([`crate::watchdog`]); nested ones are not
/// watched again.
pub(crate) fn catch<R>(f: impl FnOnce() -> R) -> Result<R, String> {
    quiet_hook();
    PANIC_AT.with(RefCell::take);
    let outer = GUARDED.with(|g| g.replace(true));
    if !outer {
        crate::watchdog::enter();
    }
    let r = panic::catch_unwind(AssertUnwindSafe(f));
    if !outer {
        crate::watchdog::leave();
    }
    GUARDED.with(|g| g.set(outer));
    r.map_err(|p| {
        let msg = panic_message(p.as_ref());
        match PANIC_AT.with(RefCell::take) {
            Some(at) => format!("{msg:?} at {at}"),
            None => format!("{msg:?}"),
        }
    })
}

/// [`catch`] for a call that returns a `Result`.
pub(crate) fn guard<R>(f: impl FnOnce() -> Result<R, String>) -> Guarded<R> {
    catch(f)
}

/// A panic payload's text (`panic!` gives a `&str` or a `String`).
fn panic_message(p: &(dyn Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(a panic whose payload is not text)".to_owned())
}
