//! How long a rank waits for the others: the engines' timeout, from `TL_DIST_TIMEOUT`.

use std::time::Duration;

/// How long a rank waits for the others by default (the per-step all-gather of `Mpi`, an NCCL
/// collective of `Nccl`): 120 s (`TL_DIST_TIMEOUT`, in seconds, overrides it).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// The timeout `TL_DIST_TIMEOUT` names (seconds), else [`DEFAULT_TIMEOUT`]; an error naming
/// `what` and the variable unless it is a positive number of seconds.
#[cfg(any(feature = "mpi", feature = "cuda", feature = "cuda-emu"))]
pub(crate) fn from_env(what: &'static str) -> crate::Result<Duration> {
    match std::env::var("TL_DIST_TIMEOUT") {
        Ok(v) => match v.trim().parse::<f64>() {
            Ok(s) if s.is_finite() && s > 0.0 && s < 1e9 => Ok(Duration::from_secs_f64(s)),
            _ => Err(crate::error::usage(
                what,
                format!("TL_DIST_TIMEOUT must be a positive number of seconds, got {v:?}"),
            )),
        },
        Err(_) => Ok(DEFAULT_TIMEOUT),
    }
}
