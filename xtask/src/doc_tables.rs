//! Checks that docs/verification.md's table of test binaries and their modules names every
//! module each binary declares (and no other), so a `<module>::` filter the doc gives exists.

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::fs;

    use crate::util;

    /// The table's rows: (the `--test` name in the second column, its test binary's main file).
    const BINARIES: [(&str, &str); 6] = [
        ("conformance", "tests/tests/conformance/main.rs"),
        (
            "tl_tape_cuda",
            "crates/tl-tape-cuda/tests/tl_tape_cuda/main.rs",
        ),
        ("tl_session", "crates/tl-session/tests/tl_session/main.rs"),
        (
            "tl_tape_cpu",
            "crates/tl-tape-cpu/tests/tl_tape_cpu/main.rs",
        ),
        ("tl_cli", "crates/tl-cli/tests/tl_cli/main.rs"),
        ("nn", "crates/tl-nn/tests/nn/main.rs"),
    ];

    /// The modules a test binary's main file declares (`mod name;` lines), `common` aside.
    fn declared(main: &str) -> BTreeSet<String> {
        main.lines()
            .filter_map(|l| l.trim().strip_prefix("mod ")?.strip_suffix(';'))
            .filter(|m| *m != "common")
            .map(str::to_owned)
            .collect()
    }

    /// The modules the table's row for `--test name` lists (its third column).
    fn listed(doc: &str, name: &str) -> BTreeSet<String> {
        let key = format!("| `{name}` |");
        let row = doc
            .lines()
            .find(|l| l.contains(&key))
            .unwrap_or_else(|| panic!("docs/verification.md has no row for --test {name}"));
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        cells[3]
            .split(" (+")
            .next()
            .unwrap_or_default()
            .split(',')
            .map(|m| m.trim().to_owned())
            .filter(|m| !m.is_empty())
            .collect()
    }

    #[test]
    fn the_verification_doc_lists_every_test_module() {
        let root = util::root();
        let doc = fs::read_to_string(root.join("docs/verification.md")).unwrap();
        for (name, main) in BINARIES {
            let main = fs::read_to_string(root.join(main)).unwrap();
            let (have, says) = (declared(&main), listed(&doc, name));
            assert_eq!(
                have, says,
                "--test {name}: the declared modules, then the doc's"
            );
        }
    }
}
