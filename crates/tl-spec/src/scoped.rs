//! A setting in force on the calling thread for a scope: [`install`] replaces the value of a
//! thread-local cell and returns a [`Guard`] that puts the previous value back when dropped.
//! The tapes' autocast setting and the CPU tape's gate overrides are such settings (PyTorch:
//! `torch.autocast` as a context manager, also thread-local).

use std::cell::Cell;
use std::marker::PhantomData;
use std::thread::LocalKey;

/// Restores the value [`install`] replaced when dropped, on the thread that installed it.
#[must_use = "the previous value is restored when the guard is dropped"]
pub struct Guard<T: Copy + 'static> {
    cell: &'static LocalKey<Cell<T>>,
    prev: T,
    /// Not `Send`: the guard restores the thread-local state of the thread that made it.
    _this_thread: PhantomData<*const ()>,
}

impl<T: Copy + std::fmt::Debug + 'static> std::fmt::Debug for Guard<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guard").field("prev", &self.prev).finish()
    }
}

/// Set `cell` to `value` on this thread until the returned guard is dropped.
pub fn install<T: Copy + 'static>(cell: &'static LocalKey<Cell<T>>, value: T) -> Guard<T> {
    Guard {
        cell,
        prev: cell.with(|c| c.replace(value)),
        _this_thread: PhantomData,
    }
}

impl<T: Copy + 'static> Drop for Guard<T> {
    fn drop(&mut self) {
        self.cell.with(|c| c.set(self.prev));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        static SETTING: Cell<u8> = const { Cell::new(0) };
    }

    #[test]
    fn install_nests_restores_and_stays_on_its_thread() {
        {
            let _a = install(&SETTING, 1);
            {
                let _b = install(&SETTING, 2);
                assert_eq!(SETTING.with(Cell::get), 2);
                let other = std::thread::spawn(|| SETTING.with(Cell::get)).join().ok();
                assert_eq!(other, Some(0));
            }
            assert_eq!(SETTING.with(Cell::get), 1);
        }
        assert_eq!(SETTING.with(Cell::get), 0);
    }
}
