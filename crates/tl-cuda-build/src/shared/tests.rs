//! The rewrite's unit tests: each form it parses, where each macro goes, and what it leaves
//! alone.

use super::poison_shared;

/// `src` rewritten, checking that it keeps its lines.
fn rw(src: &str) -> String {
    let out = poison_shared(src);
    assert_eq!(out.lines().count(), src.lines().count(), "{out}");
    out
}

/// `body` rewritten as the body of a function (`void k() {\nbody\n}`), the wrapper taken off.
fn rw_fn(body: &str) -> String {
    let out = rw(&format!("void k() {{\n{body}\n}}"));
    out.strip_prefix("void k() {\n")
        .and_then(|o| o.strip_suffix("\n}"))
        .unwrap_or_else(|| panic!("the wrapper changed: {out}"))
        .to_owned()
}

#[test]
fn an_array_gets_the_call_after_its_semicolon() {
    assert_eq!(
        rw_fn("\n    __shared__ float smem[33];\n    smem[0] = 1;\n"),
        "\n    __shared__ float smem[33]; TL_EMU_SHARED_POISON(smem);\n    smem[0] = 1;\n"
    );
}

#[test]
fn aligned_multi_dimensional_and_scalar_declarations() {
    for (src, want) in [
        (
            "{ __shared__ __align__(16) float As[2][BK][BM + 4];\n}",
            "{ __shared__ __align__(16) float As[2][BK][BM + 4]; TL_EMU_SHARED_POISON(As);\n}",
        ),
        (
            "__align__(32) __shared__ unsigned char bytes[64];",
            "__align__(32) __shared__ unsigned char bytes[64]; TL_EMU_SHARED_POISON(bytes);",
        ),
        (
            "x = 1; __shared__ unsigned int total;",
            "x = 1; __shared__ unsigned int total; TL_EMU_SHARED_POISON(total);",
        ),
        (
            "; __shared__ float tile[32][33] __align__(16);",
            "; __shared__ float tile[32][33] __align__(16); TL_EMU_SHARED_POISON(tile);",
        ),
        (
            "; volatile __shared__ float* volatile p;",
            "; volatile __shared__ float* volatile p; TL_EMU_SHARED_POISON(p);",
        ),
        (
            "; __shared__ ns::Pair<float, sizeof(int)> pairs[4];",
            "; __shared__ ns::Pair<float, sizeof(int)> pairs[4]; TL_EMU_SHARED_POISON(pairs);",
        ),
    ] {
        assert_eq!(rw_fn(src), want);
    }
}

/// The dims the repository's kernels use: `?:`, `>`, `::`, macro calls with commas.
#[test]
fn dims_may_hold_conditionals_scopes_and_macro_calls() {
    for (decl, name) in [
        (
            "__shared__ __align__(16) float smem[A > B ? A : B];",
            "smem",
        ),
        (
            "__shared__ __align__(32) unsigned char smem[tc::SMEM_BYTES];",
            "smem",
        ),
        (
            "__shared__ __align__(16) float smem[TL_FA_BWD_KV_SMEM(64, 64)];",
            "smem",
        ),
        ("__shared__ float s[(N + 1) * (M < 2 ? 2 : M)][4];", "s"),
    ] {
        let src = format!("{{\n    {decl}\n}}\n");
        let want = format!("{{\n    {decl} TL_EMU_SHARED_POISON({name});\n}}\n");
        assert_eq!(rw_fn(&src), want);
    }
}

#[test]
fn a_declaration_over_several_lines_keeps_them() {
    let src = "{ __shared__ float\n    big[4]\n    [8];\n}";
    assert_eq!(
        rw_fn(src),
        "{ __shared__ float\n    big[4]\n    [8]; TL_EMU_SHARED_POISON(big);\n}"
    );
}

#[test]
fn every_declaration_of_a_file_and_nothing_else() {
    let src = "#include \"common.cuh\"\n\
               extern \"C\" __global__ void k(float* y) {\n\
               \x20   __shared__ float a[4];\n\
               \x20   __shared__ float b[4]; y[0] = a[0] + b[0]; // __shared__ float c[4];\n\
               }\n";
    let want = "#include \"common.cuh\"\n\
                extern \"C\" __global__ void k(float* y) {\n\
                \x20   __shared__ float a[4]; TL_EMU_SHARED_POISON(a);\n\
                \x20   __shared__ float b[4]; TL_EMU_SHARED_POISON(b); y[0] = a[0] + b[0]; // __shared__ float c[4];\n\
                }\n";
    assert_eq!(rw(src), want);
}

/// Gap 1: every declarator of a declaration gets its call, in order: arrays of any rank,
/// scalars, pointers, with qualifiers and attributes, in templated types.
#[test]
fn every_declarator_of_a_declaration_is_poisoned() {
    for (decl, names) in [
        ("__shared__ float a[16], b[32];", &["a", "b"][..]),
        ("__shared__ float a, b;", &["a", "b"]),
        ("__shared__ float a[4][8], *p, s;", &["a", "p", "s"]),
        (
            "__shared__ __align__(16) float lead[2][64], acc[256] __align__(16), last;",
            &["lead", "acc", "last"],
        ),
        ("volatile __shared__ int x, y[2];", &["x", "y"]),
        (
            "__shared__ volatile float v[4], w[A > B ? A : B];",
            &["v", "w"],
        ),
        (
            "__shared__ float* volatile p, * const q, &r;",
            &["p", "q", "r"],
        ),
        (
            "__shared__ ns::Pair<float, sizeof(int)> pairs[4], one;",
            &["pairs", "one"],
        ),
        (
            "__shared__ unsigned long long n1,\n    n2[3];",
            &["n1", "n2"],
        ),
    ] {
        let calls: String = names
            .iter()
            .map(|n| format!(" TL_EMU_SHARED_POISON({n});"))
            .collect();
        assert_eq!(
            rw_fn(&format!(" {decl} x = 1;")),
            format!(" {decl}{calls} x = 1;")
        );
    }
}

#[test]
fn extern_shared_is_left_alone() {
    for src in [
        "; extern __shared__ float dyn[];",
        "; extern __shared__ __align__(16) float dyn[];",
        "; extern \"C\" __shared__ float dyn[];",
    ] {
        assert_eq!(rw_fn(src), src);
        assert_eq!(rw(src), src);
    }
}

#[test]
fn comments_strings_and_preprocessor_lines_are_left_alone() {
    for src in [
        "// __shared__ float a[4];\n",
        "/* a block comment:\n   __shared__ float a[4];\n*/\n",
        "#define TL_DYNAMIC_SHARED(T, name) extern __shared__ __align__(16) T name[]\n",
        "#define DECL(n) \\\n    __shared__ float n[4];\n",
        "  #  define X __shared__ float a[4];\n",
        "printf(\"__shared__ float a[4];\");\n",
        "c = '\"'; printf(\"; __shared__ float a[4];\");\n",
    ] {
        assert_eq!(rw_fn(src), src);
    }
    // After a directive and its continuation, code is code again; a `'` after a digit is a
    // digit separator, not a character literal.
    assert_eq!(
        rw_fn("#define A \\\n  1\n__shared__ float a[1'000];\n"),
        "#define A \\\n  1\n__shared__ float a[1'000]; TL_EMU_SHARED_POISON(a);\n"
    );
    assert_eq!(
        rw_fn("#define DECL(n) \\\r\n    __shared__ float n[4];\r\n__shared__ float b[4];\r\n"),
        "#define DECL(n) \\\r\n    __shared__ float n[4];\r\n\
         __shared__ float b[4]; TL_EMU_SHARED_POISON(b);\r\n"
    );
    assert_eq!(
        rw_fn("/* x */ __shared__ float a[4];"),
        "/* x */ __shared__ float a[4]; TL_EMU_SHARED_POISON(a);"
    );
}

/// What the rewrite does not follow stays as it was (unpoisoned, and compiling).
#[test]
fn declarations_it_cannot_parse_are_left_alone() {
    for src in [
        "; __shared__ int n = 0;",
        "; __shared__ struct { float x; } s;",
        "; __shared__ float a[4]",
        "; __shared__ float a[4;",
        "; __shared__ a[4];",
        "; __shared__ float (*f)(int);",
        "if (c) __shared__ float a[4];",
        "x = c ? 1 : __shared__ float a[4];",
        "; static __shared__ float a[4];",
        "; __shared__ float a[4] = {0};",
        "; __shared__ float a[4] __align__;",
        // Several declarators: one it does not follow leaves the whole declaration alone.
        "; __shared__ float a[4], b[4] = {0};",
        "; __shared__ float a[4], (*f)(int);",
        "; __shared__ float a, __align__(16) b;",
        "; __shared__ float a[4],;",
        "; __shared__ float a[4], b[4]",
    ] {
        assert_eq!(rw_fn(src), src);
    }
    // Past one it cannot parse, the next is still rewritten.
    assert_eq!(
        rw_fn("; __shared__ int a = 0; __shared__ float c[4];"),
        "; __shared__ int a = 0; __shared__ float c[4]; TL_EMU_SHARED_POISON(c);"
    );
}

/// Gap 2: a declaration at namespace scope (the file, a namespace, `extern "C" { }`) gets the
/// call that registers it to be poisoned at every block's start; the functions' own get the
/// block-scope call.
#[test]
fn namespace_scope_declarations_are_poisoned_at_each_block() {
    for (src, want) in [
        (
            "__shared__ float g[256];\n",
            "__shared__ float g[256]; TL_EMU_SHARED_POISON_EACH_BLOCK(g);\n",
        ),
        (
            "namespace tl { __shared__ float g[4], h; }",
            "namespace tl { __shared__ float g[4], h; TL_EMU_SHARED_POISON_EACH_BLOCK(g); \
             TL_EMU_SHARED_POISON_EACH_BLOCK(h); }",
        ),
        (
            "namespace a::b { namespace { __shared__ int n; } }",
            "namespace a::b { namespace { __shared__ int n; TL_EMU_SHARED_POISON_EACH_BLOCK(n); } }",
        ),
        (
            "inline namespace v1 { __shared__ int n; }",
            "inline namespace v1 { __shared__ int n; TL_EMU_SHARED_POISON_EACH_BLOCK(n); }",
        ),
        (
            "extern \"C\" {\n__shared__ float g[4];\n}",
            "extern \"C\" {\n__shared__ float g[4]; TL_EMU_SHARED_POISON_EACH_BLOCK(g);\n}",
        ),
        (
            "__global__ void k() { __shared__ float a[4]; }\n__shared__ float g[4];\n\
             __device__ int f(int x) { __shared__ float b[4]; return x; }",
            "__global__ void k() { __shared__ float a[4]; TL_EMU_SHARED_POISON(a); }\n\
             __shared__ float g[4]; TL_EMU_SHARED_POISON_EACH_BLOCK(g);\n\
             __device__ int f(int x) { __shared__ float b[4]; TL_EMU_SHARED_POISON(b); return x; }",
        ),
    ] {
        assert_eq!(rw(src), want);
    }
}

/// Function bodies of every shape hold code: templates (`class` in the parameter list),
/// `const` member functions, control blocks, lambdas, nested blocks.
#[test]
fn every_kind_of_function_body_and_block_holds_code() {
    for src in [
        "template <class T, int N = 4> __global__ void k(T* x) { __shared__ T s[N]; }",
        "struct S { __device__ void f() const { __shared__ float s[4]; } };",
        "__global__ void k() { for (int i = 0; i < 2; ++i) { __shared__ float s[4]; } }",
        "__global__ void k() { auto f = [&]() { __shared__ float s[4]; }; }",
        "__global__ void k() { auto f = [&] { __shared__ float s[4]; }; }",
        "__global__ void k() { if (a == b) { } else { __shared__ float s[4]; } }",
        "__global__ void k() { do { __shared__ float s[4]; } while (0); }",
        "__global__ void __launch_bounds__(256) k() { { __shared__ float s[4]; } }",
    ] {
        let out = rw(src);
        assert!(
            out.contains("float s[4]; TL_EMU_SHARED_POISON(s);")
                || out.contains("T s[N]; TL_EMU_SHARED_POISON(s);"),
            "{out}"
        );
    }
}

/// Class bodies, initializers and braces inside parentheses are not blocks of statements:
/// a declaration there is left alone (a statement would not compile, a member would change
/// the class).
#[test]
fn class_bodies_and_initializers_are_left_alone() {
    for src in [
        "struct S { __shared__ float a[4]; };",
        "template <typename T> struct S : B<T> { __shared__ float a[4]; };",
        "union U { __shared__ float a[4]; };",
        "__global__ void k() { struct L { __shared__ float a[4]; }; }",
        "__global__ void k() { run([&] { __shared__ float a[4]; }); }",
        "__global__ void k() { float v[2] = { 1, 2 }; } struct T { ; __shared__ int n; };",
    ] {
        assert_eq!(rw(src), src);
    }
}

/// Gap 4: a declaration with a `case`, `default` or `goto` label after it in its block gets
/// the call that needs no local (a jump past a local's initialisation does not compile), and
/// only then: a declaration before the switch, in a case's own block, in the last case, or
/// followed only by a nested switch's labels keeps the block-scope call.
#[test]
fn a_declaration_a_label_may_jump_past_needs_no_local() {
    let jumpable = [
        "switch (m) { case 0: __shared__ float a[4]; a[0] = 1; break; case 1: a[1] = 2; }",
        "switch (m) { case 0: { } __shared__ float a[4]; break; default: break; }",
        "switch (m) { __shared__ float a[4]; case 0: break; }",
        "switch (m) { case 0: __shared__ float a[4]; if (c) { case 1: a[0] = 1; } }",
        "__shared__ float a[4]; again: a[0] = 1; if (c) goto again;",
        "switch (m) { case A::B: __shared__ float a[4]; break; case A::C: break; }",
    ];
    for body in jumpable {
        let out = rw_fn(body);
        assert!(
            out.contains("__shared__ float a[4]; TL_EMU_SHARED_POISON_JUMPABLE(a);"),
            "{out}"
        );
    }
    let local = [
        "__shared__ float a[4]; switch (m) { case 0: break; case 1: break; }",
        "switch (m) { case 0: { __shared__ float a[4]; } break; case 1: break; }",
        "switch (m) { case 0: break; case 1: __shared__ float a[4]; a[0] = x ? 1 : 2; }",
        "switch (m) { case 0: __shared__ float a[4]; switch (n) { case 1: break; } }",
        "__shared__ float a[4]; for (auto& v : vs) { v = a[0]; } a[1] = c ? a[2] : a[3];",
        "again: __shared__ float a[4]; if (c) goto again;",
    ];
    for body in local {
        let out = rw_fn(body);
        assert!(
            out.contains("__shared__ float a[4]; TL_EMU_SHARED_POISON(a);"),
            "{out}"
        );
    }
}

/// A file whose braces do not balance outside directives (`#if` branches that each open one)
/// cannot be split into scopes: it is left as it is.
#[test]
fn a_file_whose_braces_do_not_balance_is_left_alone() {
    for src in [
        "#if A\nvoid f() {\n#else\nvoid f(int) {\n#endif\n    __shared__ float a[4];\n}\n",
        "void f() {\n    __shared__ float a[4];\n",
        "void f() }\n    __shared__ float a[4];\n",
        "void f( {\n    __shared__ float a[4];\n}\n",
    ] {
        assert_eq!(rw(src), src);
    }
}

/// Every static `__shared__` declaration of the repository's kernels (kernels/*.cu, *.cuh) and
/// the tests' user kernels gets its call, and only those.
#[test]
fn the_repositorys_declarations_are_all_rewritten() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut seen = 0;
    for dir in [
        "kernels",
        "kernels/emu",
        "crates/tl-tape-cuda/tests/user_kernels",
    ] {
        for entry in std::fs::read_dir(root.join(dir)).expect("the repository's kernels") {
            let path = entry.expect("a directory entry").path();
            if !path.extension().is_some_and(|e| e == "cu" || e == "cuh") {
                continue;
            }
            let src = std::fs::read_to_string(&path).expect("a kernel source");
            let code = String::from_utf8(super::blank(src.as_bytes())).expect("UTF-8");
            // Declarators: the static declarations' names (each `__shared__` not after `extern`,
            // plus its commas outside brackets before the `;`).
            let mut want = 0;
            let mut at = 0;
            while let Some(i) = super::find_word(code.as_bytes(), at, b"__shared__") {
                at = i + 1;
                if code[..i].trim_end().ends_with("extern") {
                    continue;
                }
                let decl = &code[i..i + code[i..].find(';').expect("a `;`")];
                let mut depth = 0i32;
                want += 1;
                for c in decl.chars() {
                    match c {
                        '[' | '(' | '<' => depth += 1,
                        ']' | ')' | '>' => depth -= 1,
                        ',' if depth == 0 => want += 1,
                        _ => {}
                    }
                }
            }
            let out = rw(&src);
            let calls = out.matches("TL_EMU_SHARED_POISON").count()
                - src.matches("TL_EMU_SHARED_POISON").count();
            assert_eq!(calls, want, "{}", path.display());
            seen += want;
        }
    }
    assert!(seen >= 20, "only {seen} declarations found");
}

#[test]
fn text_without_shared_memory_and_non_ascii_text_are_unchanged() {
    for src in [
        "",
        "int x;\n",
        "// × ⌈n/32⌉\nfloat y; /* é */\n",
        "__shared__",
    ] {
        assert_eq!(rw(src), src);
    }
    assert_eq!(
        rw_fn("// ×\n__shared__ float a[4]; // ⌈n⌉\n"),
        "// ×\n__shared__ float a[4]; TL_EMU_SHARED_POISON(a); // ⌈n⌉\n"
    );
}

/// The macros the rewrite calls are the ones the emulator's header defines.
#[test]
fn the_header_defines_every_macro_the_rewrite_calls() {
    for m in super::MACROS {
        assert!(
            crate::CUDA_EMU_H.contains(&format!("#define {m}(name)")),
            "{m}"
        );
    }
}
