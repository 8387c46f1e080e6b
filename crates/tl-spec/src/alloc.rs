//! The allocation cap: the largest single buffer any crate of the runtime will allocate.
//!
//! Shapes come from user input, and a shape of 10¹⁰ elements is well formed but cannot be held:
//! asking the allocator for it aborts the process ("memory allocation of … bytes failed") or
//! panics ("capacity overflow"). So every allocation whose size comes from input — host tensors
//! made by the tapes and the reference rules, kernel workspaces, the CUDA simulation device and
//! the CUDA caching allocator — is checked here first and refused with [`Error::TooLarge`]
//! (naming the op, the element count and the bytes) *before* anything is allocated.
//!
//! | knob | effect |
//! |---|---|
//! | [`set_max_alloc_bytes`]`(Some(n))` | cap every single buffer at `n` bytes (process-wide) |
//! | [`set_max_alloc_bytes`]`(None)` | back to the default |
//! | environment variable [`ENV_VAR`] (`TL_MAX_ALLOC_BYTES`) | the default, in bytes; `K`, `M`, `G`, `T` suffixes (powers of 1024) accepted, with a decimal fraction before a suffix (`1.5G`); read once, at the first check. Unset or empty: the default below. A value that does not parse is not silently ignored: one `warning:` line on stderr names the variable, the value and the default used instead ([`crate::env`]) |
//! | neither | the machine's physical memory (`MemTotal` of `/proc/meminfo`), or [`FALLBACK_BYTES`] (16 GiB) where that cannot be read |
//!
//! The cap bounds one buffer, not the sum of all of them: it turns "this request can never be
//! satisfied" into an error, it is not a memory budget. Empty buffers are always allowed.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::{Error, Result, Shape};

/// The environment variable that sets the default cap, in bytes (e.g. `8G`).
pub const ENV_VAR: &str = "TL_MAX_ALLOC_BYTES";

/// The default cap where neither [`ENV_VAR`] nor `/proc/meminfo` gives one: 16 GiB.
pub const FALLBACK_BYTES: usize = 16 << 30;

/// The override set by [`set_max_alloc_bytes`], plus one (0: none).
static OVERRIDE: AtomicUsize = AtomicUsize::new(0);
/// The default, computed once.
static DEFAULT: OnceLock<usize> = OnceLock::new();

/// Parse a byte count: decimal digits with an optional `K`, `M`, `G` or `T` suffix (powers of
/// 1024, case-insensitive, an optional trailing `B` or `iB`); before a suffix, a decimal
/// fraction (`1.5G`, rounded down to whole bytes). `None` when malformed or overflowing.
pub fn parse_bytes(s: &str) -> Option<usize> {
    let s = s.trim();
    let upper = s.to_ascii_uppercase();
    let body = upper
        .strip_suffix("IB")
        .or_else(|| upper.strip_suffix('B'))
        .unwrap_or(&upper);
    let (digits, shift) = match body.chars().last()? {
        'K' => (&body[..body.len() - 1], 10),
        'M' => (&body[..body.len() - 1], 20),
        'G' => (&body[..body.len() - 1], 30),
        'T' => (&body[..body.len() - 1], 40),
        _ => (body, 0),
    };
    let digits = digits.trim();
    let unit = 1usize.checked_shl(shift)?;
    match digits.split_once('.') {
        Some((whole, frac)) if shift > 0 => {
            let all_digits = |t: &str| t.bytes().all(|b| b.is_ascii_digit());
            if whole.is_empty() || frac.is_empty() || !all_digits(whole) || !all_digits(frac) {
                return None;
            }
            let whole: usize = whole.parse().ok()?;
            // The fraction's first digits, exactly: frac · unit / 10^len, rounded down.
            let frac = &frac[..frac.len().min(12)];
            let scale = 10u128.pow(frac.len() as u32);
            let part = (frac.parse::<u128>().ok()? * unit as u128) / scale;
            whole
                .checked_mul(unit)?
                .checked_add(usize::try_from(part).ok()?)
        }
        _ => digits.parse::<usize>().ok()?.checked_mul(unit),
    }
}

/// What [`ENV_VAR`] should hold, for its warning.
const EXPECTS: &str = "a byte count (digits with an optional K, M, G or T suffix, e.g. 8G or 1.5G)";

/// What is used in place of a bad [`ENV_VAR`], for its warning.
fn instead() -> String {
    match physical_memory() {
        Some(n) => format!("the default, the machine's memory ({n} bytes)"),
        None => format!("the default, {FALLBACK_BYTES} bytes"),
    }
}

/// The cap [`ENV_VAR`]'s value `v` sets, or the warning to print when it does not parse
/// ([`crate::env::warning`]'s form: the variable, the value, the default used instead).
pub fn cap_from_env(v: &str) -> std::result::Result<usize, String> {
    parse_bytes(v).ok_or_else(|| crate::env::warning(ENV_VAR, v, EXPECTS, &instead()))
}

/// The machine's physical memory in bytes (`MemTotal` of `/proc/meminfo`), if readable.
pub fn physical_memory() -> Option<usize> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kb: usize = line
        .trim_start_matches("MemTotal:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    kb.checked_mul(1024)
}

fn default_cap() -> usize {
    // Once: the default is computed once per process, so a bad value warns once.
    crate::env::read(ENV_VAR, EXPECTS, parse_bytes, instead)
        .or_else(physical_memory)
        .unwrap_or(FALLBACK_BYTES)
}

/// The cap in bytes now in force (see the module documentation for where it comes from).
pub fn max_alloc_bytes() -> usize {
    match OVERRIDE.load(Ordering::Relaxed) {
        0 => *DEFAULT.get_or_init(default_cap),
        n => n - 1,
    }
}

/// Set the process-wide cap (`Some(bytes)`) or return to the default (`None`); returns the cap
/// that was in force before. A cap of `usize::MAX` is taken as `usize::MAX − 1`.
pub fn set_max_alloc_bytes(bytes: Option<usize>) -> usize {
    let before = max_alloc_bytes();
    OVERRIDE.store(bytes.map_or(0, |b| b.saturating_add(1)), Ordering::Relaxed);
    before
}

/// Check a buffer of `n` elements of `elem_bytes` bytes each for `op`: an error when the byte
/// size overflows or exceeds the cap. `what` says which buffer (e.g. "output [3, 4]").
pub fn check_bytes(op: &'static str, what: &str, n: usize, elem_bytes: usize) -> Result<()> {
    check_bytes_named(op, || what.to_owned(), n, elem_bytes)
}

/// [`check_bytes`] with the buffer's name made only for an error (a kernel's hot path checks
/// every output and must not format a shape each time).
fn check_bytes_named(
    op: &'static str,
    what: impl FnOnce() -> String,
    n: usize,
    elem_bytes: usize,
) -> Result<()> {
    if n == 0 || elem_bytes == 0 {
        return Ok(());
    }
    let cap = max_alloc_bytes();
    match n.checked_mul(elem_bytes) {
        Some(bytes) if bytes <= cap && bytes <= isize::MAX as usize => Ok(()),
        Some(bytes) => Err(Error::TooLarge {
            op,
            detail: format!(
                "{}: {n} element(s) of {elem_bytes} byte(s) = {bytes} bytes exceed the allocation cap of {cap} bytes (set {ENV_VAR} or tl_spec::alloc::set_max_alloc_bytes to change it)",
                what()
            ),
        }),
        None => Err(Error::TooLarge {
            op,
            detail: format!(
                "{}: {n} element(s) of {elem_bytes} byte(s) overflow the byte count of this machine",
                what()
            ),
        }),
    }
}

/// Check a buffer of `n` values of `T` for `op` against the cap (see [`check_bytes`]).
pub fn check_len<T>(op: &'static str, what: &str, n: usize) -> Result<()> {
    check_bytes(op, what, n, std::mem::size_of::<T>())
}

/// Check a tensor of `shape` holding `T` for `op`: its element count must not overflow and its
/// bytes must fit under the cap.
pub fn check_shape<T>(op: &'static str, shape: &Shape) -> Result<()> {
    let n = shape.check_size(op)?;
    let what = || format!("a tensor of shape {shape}");
    check_bytes_named(op, what, n, std::mem::size_of::<T>())
}

/// An empty vector with room for `n` values, after [`check_len`]; the reservation itself is
/// fallible (`try_reserve_exact`), so a refusal by the system allocator is an error too. A
/// spare buffer of the installed [`crate::pool`] serves the request where there is one.
///
/// This is the one way the runtime allocates a buffer whose size comes from input: the other
/// helpers here ([`try_vec`], [`try_zeroed`], [`try_for_overwrite`], [`try_collect`]) build on it.
pub fn try_with_capacity<T: 'static>(op: &'static str, what: &str, n: usize) -> Result<Vec<T>> {
    check_len::<T>(op, what, n)?;
    match crate::pool::take(n) {
        Some(v) => Ok(v),
        None => reserve(op, what, n),
    }
}

/// A fresh empty vector with room for `n` values, reserved with `try_reserve_exact`.
fn reserve<T>(op: &'static str, what: &str, n: usize) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|e| Error::TooLarge {
        op,
        detail: format!("{what}: cannot allocate {n} element(s): {e}"),
    })?;
    Ok(v)
}

/// `vec![value; n]`, checked as [`try_with_capacity`].
pub fn try_vec<T: Clone + 'static>(
    op: &'static str,
    what: &str,
    n: usize,
    value: T,
) -> Result<Vec<T>> {
    let mut v = try_with_capacity(op, what, n)?;
    v.resize(n, value);
    Ok(v)
}

/// `n` zeros, checked as [`try_with_capacity`] (a spare pool buffer, cleared and filled).
pub fn try_zeroed<T: crate::Scalar>(op: &'static str, what: &str, n: usize) -> Result<Vec<T>> {
    try_vec(op, what, n, T::zero())
}

/// The `n` values of `values` (which yields at most `n`: the rest are dropped) collected into a
/// buffer checked as [`try_with_capacity`]; for a kernel that produces its output as an iterator
/// (a fallible `.collect()`).
pub fn try_collect<T: 'static>(
    op: &'static str,
    what: &str,
    n: usize,
    values: impl IntoIterator<Item = T>,
) -> Result<Vec<T>> {
    let mut v = try_with_capacity(op, what, n)?;
    v.extend(values.into_iter().take(n));
    Ok(v)
}

/// A copy of `values`, checked as [`try_with_capacity`] (a fallible `.to_vec()`).
pub fn try_copy<T: Copy + 'static>(op: &'static str, what: &str, values: &[T]) -> Result<Vec<T>> {
    let mut v = try_with_capacity(op, what, values.len())?;
    v.extend_from_slice(values);
    Ok(v)
}

/// `n` values for a kernel that writes every one of them before it reads any, checked as
/// [`try_with_capacity`]: a spare buffer of the installed pool as it is
/// ([`crate::pool::take_for_overwrite`]: no fill), else `n` zeros.
pub fn try_for_overwrite<T: crate::Scalar>(
    op: &'static str,
    what: &str,
    n: usize,
) -> Result<Vec<T>> {
    check_len::<T>(op, what, n)?;
    if let Some(v) = crate::pool::take_for_overwrite(n) {
        return Ok(v);
    }
    let mut v = reserve(op, what, n)?;
    v.resize(n, T::zero());
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_counts_parse_with_binary_suffixes() {
        assert_eq!(parse_bytes("4096"), Some(4096));
        assert_eq!(parse_bytes("8K"), Some(8 << 10));
        assert_eq!(parse_bytes(" 3 MiB "), Some(3 << 20));
        assert_eq!(parse_bytes("2g"), Some(2 << 30));
        assert_eq!(parse_bytes("1TB"), Some(1 << 40));
        assert_eq!(parse_bytes("lots"), None);
        assert_eq!(parse_bytes(""), None);
        assert_eq!(parse_bytes("99999999999999999999T"), None);
        // A fraction before a suffix, rounded down to whole bytes; not without a suffix.
        assert_eq!(parse_bytes("1.5G"), Some(3 << 29));
        assert_eq!(parse_bytes("0.5k"), Some(512));
        assert_eq!(parse_bytes("2.25MiB"), Some(9 << 18));
        assert_eq!(parse_bytes("1.0000000001K"), Some(1024));
        for bad in ["1.5", ".5G", "1.G", "1.-5G", "1..5G", "1,5G"] {
            assert_eq!(parse_bytes(bad), None, "{bad}");
        }
    }

    #[test]
    fn an_unparsable_environment_value_gives_a_warning_naming_it() {
        assert_eq!(cap_from_env("1.5G"), Ok(3 << 29));
        let w = cap_from_env("1,5G").unwrap_err();
        assert!(
            w.starts_with("warning:")
                && w.contains(ENV_VAR)
                && w.contains("\"1,5G\"")
                && w.contains("using the default"),
            "{w}"
        );
        // Boundaries: zero is a cap (every non-empty buffer refused); a sign, an overflow,
        // unicode digits or suffixes are not byte counts.
        assert_eq!(cap_from_env("0"), Ok(0));
        assert_eq!(cap_from_env(" 0K "), Ok(0));
        for bad in [
            "-1",
            "-1G",
            "18446744073709551616",
            "16777216T",
            "٨G",
            "8Ｇ",
            "8 G B x",
        ] {
            let w = cap_from_env(bad).unwrap_err();
            assert!(w.contains(&format!("{ENV_VAR}={bad:?}")), "{bad}: {w}");
        }
        // Unset, empty or spaces: the default, with no warning (not a parse at all).
        let read = |raw: &str| {
            crate::env::interpret(ENV_VAR, Some(raw.as_ref()), EXPECTS, parse_bytes, instead)
        };
        assert_eq!(read(""), Ok(None));
        assert_eq!(read("  "), Ok(None));
        assert_eq!(read(" 8K "), Ok(Some(8 << 10)));
    }

    #[test]
    fn overflowing_and_oversized_requests_are_refused_before_allocating() {
        // Far above any machine's memory whatever the cap: 2^61 f64 values.
        let e = try_vec::<f64>("test", "a buffer", 1 << 61, 0.0).unwrap_err();
        assert!(matches!(e, Error::TooLarge { op: "test", .. }), "{e}");
        let e = check_len::<u64>("test", "a buffer", usize::MAX).unwrap_err();
        assert!(e.to_string().contains("overflow"), "{e}");
        assert!(check_len::<f32>("test", "empty", 0).is_ok());
        assert_eq!(try_vec("test", "small", 3, 1.5f32).unwrap(), vec![1.5; 3]);
    }

    #[test]
    fn physical_memory_is_read_on_linux() {
        if std::path::Path::new("/proc/meminfo").exists() {
            assert!(physical_memory().is_some_and(|b| b > 1 << 20));
        }
    }
}
