//! The case timeout: a case that does not return ends the process with a message, instead of
//! hanging the test run.
//!
//! Every guarded call of the harness (run under `catch_unwind` with a quiet panic hook: each
//! case of each check, check 7's calls, the entry's shape draws) is watched. The outermost
//! guarded call on a thread records when it started, and each case of a check restarts that
//! clock ([`run_check`] and the fixed cases of check 7 say when a case starts); nested guarded
//! calls change nothing. One background thread, started at the first guarded call while a
//! timeout is set, wakes every quarter of the timeout (a second apart at most) and looks at the
//! calls in flight. When one has run longer than the timeout, it writes one message to stderr
//! naming the check (its report's label, e.g. `1 fwd myop cpu-f64`), the case number within
//! the check, how long it ran, the thread, the check's seed and case count ([`RunConfig`]) and
//! that the op or backend under test did not return; then it ends the whole process with exit
//! status [`EXIT_STATUS`] (124, as coreutils' `timeout`).
//!
//! Ending the process is the only honest way out: a Rust thread cannot be stopped from outside,
//! so a hanging op or backend cannot be failed like a panicking one and the run go on. The
//! other tests of the binary end with it, unreported (pytest-timeout's `thread` method does the
//! same). The message bypasses the test harness' output capture, so it is printed even when
//! the test's own output is captured.
//!
//! The timeout: [`DEFAULT_CASE_TIMEOUT`] (600 s: cases are small, but the CUDA kernel
//! emulator is slow), or `TL_CASE_TIMEOUT` (seconds, a positive integer; `0` or `off` turns
//! the watchdog off; read once per process, a bad value is one warning and the default), or
//! what [`set_case_timeout`] set last, which wins over the variable. A watched call costs an
//! `Instant` and two uncontended locks of its thread's own slot; a case, one more.
//!
//! [`run_check`]: crate::run_check

use std::ffi::OsStr;
use std::io::Write;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Once, OnceLock, PoisonError, Weak};
use std::thread;
use std::time::{Duration, Instant};

use crate::RunConfig;

/// The case timeout when neither `TL_CASE_TIMEOUT` nor [`set_case_timeout`] sets one.
pub const DEFAULT_CASE_TIMEOUT: Duration = Duration::from_secs(600);

/// The exit status of a process ended by the watchdog (coreutils' `timeout` uses 124 too).
pub const EXIT_STATUS: i32 = 124;

/// [`set_case_timeout`]'s value in nanoseconds: [`UNSET`] (the environment's), 0 (off).
static SET: AtomicU64 = AtomicU64::new(UNSET);
const UNSET: u64 = u64::MAX;

/// Set the case timeout for the whole process, over `TL_CASE_TIMEOUT`: `None` (or a zero
/// duration) turns the watchdog off. It applies to every thread, every check and every
/// [`RunConfig`]; to change it for one test, keep [`case_timeout`] and set it back after.
pub fn set_case_timeout(timeout: Option<Duration>) {
    let nanos = timeout.map_or(0, |t| u64::try_from(t.as_nanos()).unwrap_or(UNSET - 1));
    SET.store(nanos.min(UNSET - 1), Ordering::Relaxed);
}

/// The case timeout in force: [`set_case_timeout`]'s, else `TL_CASE_TIMEOUT`'s, else
/// [`DEFAULT_CASE_TIMEOUT`]; `None` when the watchdog is off.
pub fn case_timeout() -> Option<Duration> {
    static ENV: OnceLock<Option<Duration>> = OnceLock::new();
    match SET.load(Ordering::Relaxed) {
        UNSET => *ENV.get_or_init(|| {
            timeout_from(std::env::var_os("TL_CASE_TIMEOUT").as_deref()).unwrap_or_else(|w| {
                eprintln!("{w}");
                Some(DEFAULT_CASE_TIMEOUT)
            })
        }),
        0 => None,
        nanos => Some(Duration::from_nanos(nanos)),
    }
}

/// How a raw value of `TL_CASE_TIMEOUT` reads: the timeout (`None`: off, for `0` or `off` in
/// any case), the default when unset or empty, or the warning to print
/// ([`tl_spec::env::interpret`]).
pub fn timeout_from(raw: Option<&OsStr>) -> Result<Option<Duration>, String> {
    let parse = |s: &str| match s.parse::<u64>() {
        Ok(0) => Some(None),
        Ok(secs) => Some(Some(Duration::from_secs(secs))),
        Err(_) => s.eq_ignore_ascii_case("off").then_some(None),
    };
    let expects = "a case timeout in seconds (a positive integer; 0 or off turns it off)";
    let instead = || format!("the default, {} s", DEFAULT_CASE_TIMEOUT.as_secs());
    tl_spec::env::interpret("TL_CASE_TIMEOUT", raw, expects, parse, instead)
        .map(|t| t.unwrap_or(Some(DEFAULT_CASE_TIMEOUT)))
}

/// A check: its report's label, and its configuration (none for fixed cases).
type Check = (Arc<str>, Option<RunConfig>);

/// What one thread is doing, as the watchdog sees it.
#[derive(Default)]
struct State {
    /// The check running.
    check: Option<Check>,
    /// The case within the check, from 1 (0: before the first).
    case: u32,
    /// When the outermost guarded call, or the case within it, started.
    since: Option<Instant>,
}

/// One thread's [`State`], and the thread's name for the message.
struct Slot {
    thread: String,
    state: Mutex<State>,
}

/// Every live thread's slot that has made a guarded call.
static SLOTS: Mutex<Vec<Weak<Slot>>> = Mutex::new(Vec::new());

thread_local! {
    static SLOT: Arc<Slot> = {
        let name = thread::current().name().unwrap_or("(unnamed)").to_owned();
        let slot = Arc::new(Slot { thread: name, state: Mutex::default() });
        let mut slots = lock(&SLOTS);
        slots.retain(|s| s.strong_count() > 0);
        slots.push(Arc::downgrade(&slot));
        slot
    };
}

/// A lock that a panic elsewhere did not spoil (nothing panics while holding these).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `f` on this thread's state (nothing while the thread is being torn down).
fn with_state(f: impl FnOnce(&mut State)) {
    let _ = SLOT.try_with(|slot| f(&mut lock(&slot.state)));
}

/// While alive, this thread runs the check `label` with `cfg` (see [`checking`]).
pub(crate) struct Checking {
    previous: (Option<Check>, u32),
    _thread: PhantomData<*const ()>,
}

/// This thread's guarded calls belong to the check `label`, run with `cfg` (`None`: fixed
/// cases), until the result is dropped.
pub(crate) fn checking(label: &str, cfg: Option<&RunConfig>) -> Checking {
    let mut previous = (None, 0);
    with_state(|s| {
        previous = (s.check.replace((label.into(), cfg.copied())), s.case);
        s.case = 0;
    });
    Checking {
        previous,
        _thread: PhantomData,
    }
}

impl Drop for Checking {
    fn drop(&mut self) {
        let (check, case) = std::mem::take(&mut self.previous);
        with_state(|s| (s.check, s.case) = (check, case));
    }
}

/// Case `n` of this thread's check starts: its clock restarts.
pub(crate) fn case_started(n: u32) {
    with_state(|s| {
        s.case = n;
        if s.since.is_some() {
            s.since = Some(Instant::now());
        }
    });
}

/// This thread's outermost guarded call starts (see the module documentation).
pub(crate) fn enter() {
    with_state(|s| s.since = Some(Instant::now()));
    if case_timeout().is_some() {
        static START: Once = Once::new();
        START.call_once(|| {
            let spawned = thread::Builder::new()
                .name("tl-conformance case watchdog".into())
                .spawn(watch);
            if let Err(e) = spawned {
                eprintln!(
                    "warning: tl-conformance could not start its case watchdog ({e}); a case that does not return will hang the run"
                );
            }
        });
    }
}

/// This thread's outermost guarded call returned.
pub(crate) fn leave() {
    with_state(|s| s.since = None);
}

/// The watchdog thread: wake, look, and end the process on a case past the timeout.
fn watch() {
    loop {
        let tick = case_timeout().map_or(Duration::from_secs(1), |t| {
            (t / 4).clamp(Duration::from_millis(10), Duration::from_secs(1))
        });
        thread::sleep(tick);
        let Some(timeout) = case_timeout() else {
            continue;
        };
        let now = Instant::now();
        let slots: Vec<Arc<Slot>> = lock(&SLOTS).iter().filter_map(Weak::upgrade).collect();
        let overdue = slots.iter().find_map(|slot| {
            let s = lock(&slot.state);
            let ran = now.saturating_duration_since(s.since?);
            (ran > timeout).then(|| message(&slot.thread, &s, ran, timeout))
        });
        if let Some(message) = overdue {
            // Straight to stderr, past the test harness' capture of the thread that started us.
            let mut err = std::io::stderr().lock();
            let _ = writeln!(err, "{message}");
            let _ = err.flush();
            std::process::exit(EXIT_STATUS);
        }
    }
}

/// The watchdog's message for the call of `s`, on `thread`, that ran `ran` past `timeout`.
fn message(thread: &str, s: &State, ran: Duration, timeout: Duration) -> String {
    let check = match &s.check {
        Some((label, _)) => format!("the check \"{label}\""),
        None => "a guarded call outside any check".to_owned(),
    };
    let case = match s.case {
        0 => String::new(),
        n => format!(", case {n} (drawn and shrunk cases counted from 1),"),
    };
    let config = match &s.check {
        Some((_, Some(c))) => format!(
            "The check ran with RunConfig {{ cases: {}, seed: {:#x} }} (from TL_CASES and TL_SEED unless set in code; check 7 runs an eighth of the run's cases): the same seed and case count reproduce the case.",
            c.cases, c.seed
        ),
        Some((_, None)) => "The check's cases are fixed: rerunning it reproduces the case.".into(),
        None => String::new(),
    };
    format!(
        "error: tl-conformance: {check}{case} has run for {:.2} s on thread \"{thread}\", past the case timeout of {} (TL_CASE_TIMEOUT): the op or backend under test did not return (an infinite loop or a deadlock?). A thread cannot be stopped, so the watchdog ends the process with exit status {EXIT_STATUS}. {config} TL_CASE_TIMEOUT=<seconds> (or tl_conformance::set_case_timeout) gives a slow case more time; TL_CASE_TIMEOUT=0 turns the watchdog off.",
        ran.as_secs_f64(),
        seconds(timeout),
    )
}

/// `600 s`, or `0.250 s` for a timeout that is not whole seconds.
fn seconds(d: Duration) -> String {
    match d.subsec_nanos() {
        0 => format!("{} s", d.as_secs()),
        _ => format!("{:.3} s", d.as_secs_f64()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn case_timeout_variable_values() {
        let read = |v: &str| timeout_from(Some(v.as_ref()));
        let secs = |n| Ok(Some(Duration::from_secs(n)));
        assert_eq!(timeout_from(None), Ok(Some(DEFAULT_CASE_TIMEOUT)));
        assert_eq!(read("  "), Ok(Some(DEFAULT_CASE_TIMEOUT)));
        assert_eq!(read("1"), secs(1));
        assert_eq!(read(" 3600 "), secs(3600));
        for off in ["0", "00", "off", "OFF", " Off "] {
            assert_eq!(read(off), Ok(None), "{off}");
        }
        for bad in ["-1", "1.5", "1s", "0x10", "never", "18446744073709551616"] {
            let w = read(bad).unwrap_err();
            assert!(
                w.starts_with(&format!(
                    "warning: TL_CASE_TIMEOUT={bad:?} is not a case timeout in seconds"
                )) && w.ends_with("using the default, 600 s"),
                "{w}"
            );
        }
    }

    #[test]
    fn the_message_names_the_check_the_case_the_time_and_the_reproduction() {
        let s = State {
            check: Some((
                "1 fwd myop cpu-f64".into(),
                Some(RunConfig { cases: 32, seed: 7 }),
            )),
            case: 3,
            since: None,
        };
        let m = message(
            "t",
            &s,
            Duration::from_millis(2_346),
            Duration::from_secs(2),
        );
        for part in [
            "the check \"1 fwd myop cpu-f64\", case 3",
            "has run for 2.35 s on thread \"t\"",
            "past the case timeout of 2 s (TL_CASE_TIMEOUT)",
            "did not return",
            "exit status 124",
            "RunConfig { cases: 32, seed: 0x7 }",
            "TL_SEED",
        ] {
            assert!(m.contains(part), "{part:?} in {m}");
        }
        assert_eq!(seconds(Duration::from_millis(250)), "0.250 s");
    }

    /// The setter wins over the environment, and a zero duration is off.
    #[test]
    fn the_setter_sets_the_process_wide_timeout() {
        let before = case_timeout();
        set_case_timeout(Some(Duration::from_secs(7_200)));
        assert_eq!(case_timeout(), Some(Duration::from_secs(7_200)));
        set_case_timeout(Some(Duration::ZERO));
        assert_eq!(case_timeout(), None);
        set_case_timeout(Some(Duration::MAX));
        assert!(case_timeout() > Some(Duration::from_secs(1 << 33)));
        set_case_timeout(before);
        assert_eq!(case_timeout(), before);
    }
}
