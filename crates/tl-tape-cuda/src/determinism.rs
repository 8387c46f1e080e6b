//! Deterministic reductions mode (TorchLean's "Deterministic Reductions Mode").
//!
//! On a GPU, a kernel that accumulates with `atomicAdd` adds in whatever order the hardware
//! interleaves the updates, and float addition is not associative, so two runs can differ in the
//! last bits. Every such accumulation path has a fixed-order alternative, selected by this
//! process-wide flag:
//!
//! | path | fast path (flag off, real CUDA) | fixed-order path (flag on; always on sim) |
//! |---|---|---|
//! | `reduce_sum` / `reduce_mean` to one value | per-block partials combined with `atomicAdd` | fixed grid, per-thread strided sums, warp-shuffle tree, partials array, second pass (see [`crate::device::sim`]) |
//! | broadcast backward (`reduce_broadcast`) | one `atomicAdd` per cotangent element | one thread per output element, summing its preimage in increasing row-major order |
//! | scatter-add (later op sets), pooling backward | `atomicAdd` | one thread per output element, fixed order |
//! | fused attention backward (`flash_attention_bwd`, head size d ≤ 64) | one pass over blocks of 64 keys (`tl_flash_bwd_atomic`): each block's dQ sums added with `atomicAdd` | two kernels (`tl_flash_bwd_q` for dQ over query tiles, `tl_flash_bwd_kv`), every sum in key (row) order ([`crate::gates::force_flash_bwd_one_pass`] forces either path) |
//!
//! The simulation device runs the fixed-order path always (it *is* the twin of the deterministic
//! kernels), so on sim the flag changes nothing and results are reproducible bit for bit.
//!
//! The initial value comes from the environment variable [`ENV_VAR`] (`TL_DETERMINISTIC=1`,
//! `true`, `on` or `yes` turn it on; `0`, `false`, `off`, `no` or empty leave it off; any other
//! value leaves it off with one warning on stderr), read once on first use. PyTorch equivalent:
//! `torch.use_deterministic_algorithms(True)`.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

/// The environment variable that sets the initial value of the flag.
pub const ENV_VAR: &str = "TL_DETERMINISTIC";

static FLAG: OnceLock<AtomicBool> = OnceLock::new();

/// What [`ENV_VAR`] should hold, for its warning.
const EXPECTS: &str = "a switch (1, true, on, yes or 0, false, off, no)";

/// What is used in place of a bad [`ENV_VAR`], for its warning.
fn instead() -> String {
    "the default, off".to_owned()
}

fn flag() -> &'static AtomicBool {
    FLAG.get_or_init(|| {
        let on = tl_spec::env::read(ENV_VAR, EXPECTS, tl_spec::env::parse_switch, instead);
        AtomicBool::new(on.unwrap_or(false))
    })
}

/// How the environment variable's value is read: `1`, `true`, `on`, `yes` (any case, surrounding
/// spaces ignored) mean on; `0`, `false`, `off`, `no`, an empty value or no variable mean off.
/// Anything else is off too, and when read from the environment it prints one warning naming
/// the variable and the value ([`tl_spec::env::read`]).
pub fn parse_flag(value: Option<&str>) -> bool {
    value.and_then(tl_spec::env::parse_switch).unwrap_or(false)
}

/// Turn deterministic reductions on or off for the whole process.
pub fn set_deterministic_reductions(on: bool) {
    flag().store(on, Ordering::SeqCst);
}

/// Whether deterministic reductions are on.
pub fn deterministic_reductions() -> bool {
    flag().load(Ordering::SeqCst)
}

/// Set the flag and return the value observed right after (TorchLean's `*_checked` form: one call
/// whose result depends on the write).
pub fn set_deterministic_reductions_checked(on: bool) -> bool {
    set_deterministic_reductions(on);
    deterministic_reductions()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_values_that_mean_on() {
        for v in ["1", "true", "TRUE", " on ", "yes"] {
            assert!(parse_flag(Some(v)), "{v:?}");
        }
        for v in ["0", "false", "", "2", "off"] {
            assert!(!parse_flag(Some(v)), "{v:?}");
        }
        assert!(!parse_flag(None));
    }

    #[test]
    fn env_values_that_are_neither_warn_and_leave_it_off() {
        let read = |v: &str| {
            tl_spec::env::interpret(
                ENV_VAR,
                Some(v.as_ref()),
                EXPECTS,
                tl_spec::env::parse_switch,
                instead,
            )
        };
        assert_eq!(read(" Yes "), Ok(Some(true)));
        assert_eq!(read("OFF"), Ok(Some(false)));
        assert_eq!(read("no"), Ok(Some(false)));
        assert_eq!(read(""), Ok(None));
        for bad in ["2", "-1", "enable", "ｏｎ", "true!"] {
            assert_eq!(
                read(bad).unwrap_err(),
                format!(
                    "warning: TL_DETERMINISTIC={bad:?} is not a switch (1, true, on, yes or 0, \
                     false, off, no); using the default, off"
                )
            );
            assert!(!parse_flag(Some(bad)));
        }
    }

    #[test]
    fn checked_setter_returns_the_observed_value() {
        // Tests run in parallel and share the flag; only this test writes it.
        let before = deterministic_reductions();
        assert!(set_deterministic_reductions_checked(true));
        assert!(deterministic_reductions());
        assert!(!set_deterministic_reductions_checked(false));
        set_deterministic_reductions(before);
        assert_eq!(deterministic_reductions(), before);
    }
}
