//! Run configuration: how many cases per check (`TL_CASES`), which seed (`TL_SEED`), and the
//! deterministic proptest runner built from them. The case timeout (`TL_CASE_TIMEOUT`) is not
//! a field: it is the process's, set with [`crate::set_case_timeout`] ([`crate::watchdog`]).

use std::sync::OnceLock;

use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

/// Default number of cases per check when `TL_CASES` is not set: small, so that
/// `cargo test --workspace` stays quick on a small machine. A long run is one variable away.
pub const DEFAULT_CASES: u32 = 128;

/// Default seed when `TL_SEED` is not set. Every run with the same seed and case count
/// generates exactly the same inputs.
pub const DEFAULT_SEED: u64 = 0x007E_570F_7EA5;

/// How many cases each check runs and from which seed.
///
/// How long one case may run is not part of it: a case past the process-wide case timeout
/// (`TL_CASE_TIMEOUT`, 600 s by default) ends the process with a message naming the check and
/// this configuration; [`crate::set_case_timeout`] sets the timeout in code
/// ([`crate::watchdog`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunConfig {
    /// Passing cases each check must see (proptest's `cases`).
    pub cases: u32,
    /// The base seed; each check derives its own stream from it and the check's label.
    pub seed: u64,
}

impl Default for RunConfig {
    fn default() -> Self {
        RunConfig {
            cases: DEFAULT_CASES,
            seed: DEFAULT_SEED,
        }
    }
}

impl RunConfig {
    /// `TL_CASES` and `TL_SEED` from the environment, falling back to the defaults.
    /// Each is read once per process; unset or empty is the default, and a value that does not
    /// parse is reported (one warning naming the variable and the value) and ignored.
    pub fn from_env() -> Self {
        Self::from_env_or(DEFAULT_CASES)
    }

    /// Like [`RunConfig::from_env`], with `cases` as the default case count.
    pub fn from_env_or(cases: u32) -> Self {
        RunConfig {
            cases: env_number("TL_CASES").map_or(cases, |v| v.min(u64::from(u32::MAX)) as u32),
            seed: env_number("TL_SEED").unwrap_or(DEFAULT_SEED),
        }
    }

    /// A proptest runner for the check named `label`, with a fixed RNG stream derived from
    /// `(seed, label)`: reproducible, and independent between checks. Failures are shrunk, and
    /// nothing is persisted to disk (the seed is the reproduction recipe).
    pub fn runner(&self, label: &str) -> TestRunner {
        let config = Config {
            cases: self.cases,
            failure_persistence: None,
            max_shrink_iters: 50_000,
            max_shrink_time: 20_000,
            max_local_rejects: 100_000,
            max_global_rejects: 10_000,
            ..Config::default()
        };
        TestRunner::new_with_rng(
            config,
            TestRng::from_seed(RngAlgorithm::ChaCha, &seed_bytes(self.seed, label)),
        )
    }
}

/// A number as `TL_CASES` and `TL_SEED` take it: decimal, or hexadecimal after `0x`, that fits
/// `u64`.
pub fn parse_number(s: &str) -> Option<u64> {
    let s = s.trim();
    match s.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => s.parse().ok(),
    }
}

/// What is used in place of a bad `var`, for its warning.
fn instead(var: &str) -> String {
    match var {
        "TL_SEED" => format!("the default seed, {DEFAULT_SEED:#x}"),
        _ => format!(
            "each check's default case count ({DEFAULT_CASES} unless the check sets its own)"
        ),
    }
}

/// How the raw value of `var` (`TL_CASES` or `TL_SEED`) reads: the number, `Ok(None)` when
/// unset or empty, or the warning to print ([`tl_spec::env::interpret`]). `TL_CASES` must be
/// positive: with 0 cases every check would pass without looking at anything.
pub fn number_from(
    var: &str,
    raw: Option<&std::ffi::OsStr>,
) -> std::result::Result<Option<u64>, String> {
    let cases = var == "TL_CASES";
    let (expects, parse): (&str, fn(&str) -> Option<u64>) = match cases {
        true => (
            "a positive number (decimal, or hexadecimal after 0x; 0 cases would check nothing)",
            |s| parse_number(s).filter(|&n| n > 0),
        ),
        false => ("a number (decimal, or hexadecimal after 0x)", parse_number),
    };
    tl_spec::env::interpret(var, raw, expects, parse, || instead(var))
}

/// `TL_CASES` or `TL_SEED`, read (and warned about) once per process.
fn env_number(var: &'static str) -> Option<u64> {
    static CASES: OnceLock<Option<u64>> = OnceLock::new();
    static SEED: OnceLock<Option<u64>> = OnceLock::new();
    let cell = if var == "TL_SEED" { &SEED } else { &CASES };
    *cell.get_or_init(|| {
        number_from(var, std::env::var_os(var).as_deref()).unwrap_or_else(|w| {
            eprintln!("{w}");
            None
        })
    })
}

/// 32 seed bytes from a base seed and a label (FNV-1a of the label, then splitmix64 to spread).
fn seed_bytes(seed: u64, label: &str) -> [u8; 32] {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in label.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    let mut z = seed ^ h;
    let mut out = [0u8; 32];
    for chunk in out.chunks_mut(8) {
        z = splitmix64(z);
        chunk.copy_from_slice(&z.to_le_bytes());
    }
    out
}

/// SplitMix64 (the constants of SEMANTICS.md): a cheap, well-mixed hash of a `u64`.
pub fn splitmix64(z: u64) -> u64 {
    let z1 = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let z2 = (z1 ^ (z1 >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    let z3 = (z2 ^ (z2 >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z3 ^ (z3 >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_differ_by_label_and_seed_but_not_by_run() {
        assert_eq!(seed_bytes(1, "add"), seed_bytes(1, "add"));
        assert_ne!(seed_bytes(1, "add"), seed_bytes(1, "sub"));
        assert_ne!(seed_bytes(1, "add"), seed_bytes(2, "add"));
    }

    #[test]
    fn case_and_seed_variable_values() {
        let read = |var: &str, v: &str| number_from(var, Some(v.as_ref()));
        assert_eq!(read("TL_CASES", "500"), Ok(Some(500)));
        assert_eq!(read("TL_SEED", " 0 "), Ok(Some(0)));
        let w = read("TL_CASES", " 0 ").unwrap_err();
        assert!(
            w.starts_with("warning: TL_CASES=\" 0 \" is not a positive number")
                && w.contains("0 cases would check nothing")
                && w.contains("default case count"),
            "{w}"
        );
        assert!(read("TL_CASES", "0x0").is_err());
        assert_eq!(read("TL_SEED", "0x7e"), Ok(Some(0x7e)));
        assert_eq!(read("TL_SEED", &u64::MAX.to_string()), Ok(Some(u64::MAX)));
        assert_eq!(read("TL_SEED", ""), Ok(None));
        assert_eq!(read("TL_CASES", "  "), Ok(None));
        for bad in [
            "-1",
            "1e3",
            "0x",
            "0xfg",
            "18446744073709551616",
            "五",
            "many",
        ] {
            let w = read("TL_CASES", bad).unwrap_err();
            assert!(
                w.starts_with(&format!(
                    "warning: TL_CASES={bad:?} is not a positive number"
                )) && w.contains("default case count"),
                "{w}"
            );
            let w = read("TL_SEED", bad).unwrap_err();
            assert!(
                w.starts_with(&format!("warning: TL_SEED={bad:?} is not a number"))
                    && w.ends_with("the default seed, 0x7e570f7ea5"),
                "{w}"
            );
        }
    }
}
