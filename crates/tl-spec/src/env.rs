//! Reading the `TL_*` environment variables one way: a value, or the default with one warning.
//!
//! Every variable whose meaning is "this value, else the default" (`TL_NUM_THREADS`, `TL_SIMD`,
//! `TL_DETERMINISTIC`, `TL_MAX_ALLOC_BYTES`, the harness's `TL_CASES`, `TL_SEED` and
//! `TL_CASE_TIMEOUT`) is read with [`read`]: unset, or empty after trimming spaces, is the
//! default with no word; a value the variable's parser accepts is used; any other value (including one that is not UTF-8)
//! prints one `warning:` line on stderr naming the variable, the value, what it should be and
//! what is used instead, and the default applies. The callers keep the result in a `OnceLock`,
//! so each variable is read, and warned about, once per process. The table of every variable
//! is in docs/guide.md, "Environment variables".
//!
//! [`interpret`] is the pure part (no environment, no stderr), for tests.

use std::ffi::OsStr;

/// The warning for a value of `name` that is not what it should be: `warning:
/// NAME="value" is not <expects>; using <instead>`.
pub fn warning(name: &str, value: &str, expects: &str, instead: &str) -> String {
    format!("warning: {name}={value:?} is not {expects}; using {instead}")
}

/// How the raw value `raw` of the variable `name` reads with `parse`: `Ok(None)` when it is
/// unset or empty after trimming spaces, `Ok(Some(v))` when `parse` accepts it (it is given
/// the value trimmed of surrounding spaces), else `Err` with the [`warning`] text, naming
/// `expects` (what the value should be, e.g. "a thread count (a positive integer)") and
/// `instead()` (what is used in its place, e.g. "the default, 2 threads").
pub fn interpret<T>(
    name: &str,
    raw: Option<&OsStr>,
    expects: &str,
    parse: impl FnOnce(&str) -> Option<T>,
    instead: impl FnOnce() -> String,
) -> Result<Option<T>, String> {
    let Some(raw) = raw else {
        return Ok(None);
    };
    let Some(text) = raw.to_str() else {
        return Err(warning(
            name,
            &raw.to_string_lossy(),
            &format!("{expects} (it is not UTF-8)"),
            &instead(),
        ));
    };
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Ok(None);
    }
    match parse(trimmed) {
        Some(v) => Ok(Some(v)),
        None => Err(warning(name, text, expects, &instead())),
    }
}

/// The environment variable `name` read with `parse` (see [`interpret`]): `None` when it is
/// unset, empty, or does not parse; in the last case one warning is printed to stderr. Call it
/// once per process (keep the result in a `OnceLock`).
pub fn read<T>(
    name: &str,
    expects: &str,
    parse: impl FnOnce(&str) -> Option<T>,
    instead: impl FnOnce() -> String,
) -> Option<T> {
    match interpret(
        name,
        std::env::var_os(name).as_deref(),
        expects,
        parse,
        instead,
    ) {
        Ok(v) => v,
        Err(w) => {
            eprintln!("{w}");
            None
        }
    }
}

/// A positive whole number that fits `usize` (a thread count): ASCII digits, an optional
/// leading `+`; `None` for zero, a minus sign, a fraction, an overflow or anything else.
pub fn parse_positive(s: &str) -> Option<usize> {
    s.trim().parse::<usize>().ok().filter(|&n| n > 0)
}

/// An on/off flag: `1`, `true`, `on`, `yes` are `Some(true)`; `0`, `false`, `off`, `no` are
/// `Some(false)` (any case, surrounding spaces ignored); anything else is `None`.
pub fn parse_switch(s: &str) -> Option<bool> {
    match s.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "on" | "yes" => Some(true),
        "0" | "false" | "off" | "no" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;

    fn os(s: &str) -> OsString {
        OsString::from(s)
    }

    #[test]
    fn unset_and_empty_are_the_default_without_a_warning() {
        let never = |_: &str| -> Option<usize> { panic!("not parsed") };
        assert_eq!(interpret("V", None, "x", never, String::new), Ok(None));
        for v in ["", " ", "\t \n"] {
            assert_eq!(
                interpret("V", Some(&os(v)), "x", never, String::new),
                Ok(None),
                "{v:?}"
            );
        }
    }

    #[test]
    fn a_value_is_parsed_trimmed() {
        let got = interpret("V", Some(&os("  7 ")), "x", parse_positive, String::new);
        assert_eq!(got, Ok(Some(7)));
    }

    #[test]
    fn a_bad_value_warns_naming_the_variable_the_value_and_the_default() {
        let w = interpret(
            "TL_NUM_THREADS",
            Some(&os("four")),
            "a thread count (a positive integer)",
            parse_positive,
            || "the default, 2 threads".to_owned(),
        )
        .unwrap_err();
        assert_eq!(
            w,
            "warning: TL_NUM_THREADS=\"four\" is not a thread count (a positive integer); \
             using the default, 2 threads"
        );
        // Unicode and quotes are shown escaped by `{:?}`, never raw.
        let w = interpret(
            "V",
            Some(&os("ｆｏｕｒ\"")),
            "x",
            parse_positive,
            || "d".into(),
        );
        assert!(w.unwrap_err().contains("V=\"ｆｏｕｒ\\\"\""));
    }

    #[cfg(unix)]
    #[test]
    fn a_value_that_is_not_utf8_warns() {
        use std::os::unix::ffi::OsStringExt;
        let raw = OsString::from_vec(vec![b'4', 0xff]);
        let w = interpret("V", Some(&raw), "a count", parse_positive, || "d".into());
        let w = w.unwrap_err();
        assert!(
            w.contains("V=\"4\u{fffd}\"") && w.contains("not UTF-8"),
            "{w}"
        );
    }

    #[test]
    fn positive_counts() {
        assert_eq!(parse_positive("1"), Some(1));
        assert_eq!(parse_positive(" 12 "), Some(12));
        assert_eq!(parse_positive("+3"), Some(3));
        assert_eq!(parse_positive(&usize::MAX.to_string()), Some(usize::MAX));
        for bad in [
            "",
            " ",
            "0",
            "-1",
            "-0",
            "1.5",
            "four",
            "4 threads",
            "٣", // an Arabic-Indic three: digits are ASCII only
            "18446744073709551616",
            "99999999999999999999999",
        ] {
            assert_eq!(parse_positive(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn switches() {
        for v in ["1", "true", "TRUE", " on ", "Yes"] {
            assert_eq!(parse_switch(v), Some(true), "{v:?}");
        }
        for v in ["0", "false", "OFF", " no ", "False"] {
            assert_eq!(parse_switch(v), Some(false), "{v:?}");
        }
        for v in ["", "2", "enable", "y", "ｙｅｓ", "-1", "on off"] {
            assert_eq!(parse_switch(v), None, "{v:?}");
        }
    }
}
