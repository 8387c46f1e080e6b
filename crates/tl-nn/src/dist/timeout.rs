//! How long a rank waits for the others: the engines' timeout, from `TL_DIST_TIMEOUT`.

use std::ffi::OsStr;
use std::time::Duration;

/// How long a rank waits for the others by default (the per-step all-gather of `Mpi`, an NCCL
/// collective of `Nccl`): 120 s (`TL_DIST_TIMEOUT`, in seconds, overrides it).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// The variable that overrides [`DEFAULT_TIMEOUT`].
#[cfg_attr(
    not(any(feature = "mpi", feature = "cuda", feature = "cuda-emu")),
    allow(dead_code)
)]
const VAR: &str = "TL_DIST_TIMEOUT";

/// The timeout `TL_DIST_TIMEOUT` names (seconds), else [`DEFAULT_TIMEOUT`]; an error naming
/// `what` and the variable unless it is a positive number of seconds.
#[cfg(any(feature = "mpi", feature = "cuda", feature = "cuda-emu"))]
pub(crate) fn from_env(what: &'static str) -> crate::Result<Duration> {
    timeout_from(std::env::var_os(VAR).as_deref()).map_err(|e| crate::error::usage(what, e))
}

/// How `TL_DIST_TIMEOUT`'s raw value reads: unset or empty (after trimming spaces) is
/// [`DEFAULT_TIMEOUT`]; a finite number of seconds in (0, 10⁹) is that; anything else (zero, a
/// negative or non-finite number, text, a value that is not UTF-8) is an error naming the
/// variable and the value: a job must not wait forever, or not at all, because of a typo.
#[cfg_attr(
    not(any(feature = "mpi", feature = "cuda", feature = "cuda-emu", test)),
    allow(dead_code)
)]
fn timeout_from(raw: Option<&OsStr>) -> Result<Duration, String> {
    let Some(raw) = raw else {
        return Ok(DEFAULT_TIMEOUT);
    };
    let bad = || {
        format!(
            "{VAR} must be a positive number of seconds, got {:?}",
            raw.to_string_lossy()
        )
    };
    let text = raw.to_str().ok_or_else(bad)?.trim();
    if text.is_empty() {
        return Ok(DEFAULT_TIMEOUT);
    }
    match text.parse::<f64>() {
        Ok(s) if s.is_finite() && s > 0.0 && s < 1e9 => Ok(Duration::from_secs_f64(s)),
        _ => Err(bad()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeout_values() {
        let read = |v: &str| timeout_from(Some(v.as_ref()));
        assert_eq!(timeout_from(None), Ok(DEFAULT_TIMEOUT));
        assert_eq!(read(""), Ok(DEFAULT_TIMEOUT));
        assert_eq!(read("  "), Ok(DEFAULT_TIMEOUT));
        assert_eq!(read("30"), Ok(Duration::from_secs(30)));
        assert_eq!(read(" 0.5 "), Ok(Duration::from_millis(500)));
        for bad in ["0", "-1", "inf", "NaN", "1e9", "1e400", "ten", "٣٠", "30s"] {
            assert_eq!(
                read(bad),
                Err(format!(
                    "TL_DIST_TIMEOUT must be a positive number of seconds, got {bad:?}"
                ))
            );
        }
    }

    #[cfg(unix)]
    #[test]
    fn a_timeout_that_is_not_utf8_is_an_error() {
        use std::os::unix::ffi::OsStrExt;
        let e = timeout_from(Some(OsStr::from_bytes(b"3\xff"))).unwrap_err();
        assert!(
            e.contains("TL_DIST_TIMEOUT") && e.contains("3\u{fffd}"),
            "{e}"
        );
    }
}
