//! The emulator build's rewrite of a `.cu` source so that its static shared memory starts each
//! block poisoned, as dynamic shared memory does (docs/cuda.md, "The kernel emulator").
//!
//! In the emulator `__shared__` is `static thread_local` (`cuda_emu.h`): without help a static
//! shared array starts at 0 and keeps the previous block's values, so a kernel that reads it
//! before writing it looks right there and gives garbage on a GPU, where shared memory is
//! undefined at a block's start. A macro cannot reach the variable's name, so [`poison_shared`]
//! rewrites the source: after each declaration's `;`, on the same line (line numbers stay), it
//! adds ` TL_EMU_SHARED_POISON(NAME);`, which `cuda_emu.h` expands to a declaration whose
//! initializer calls the runtime's `tl_emu_shared_poison(&NAME, sizeof(NAME))`: the first
//! thread of a block to execute the declaration fills the variable with 0xFF bytes, later ones
//! (and later executions in the same block) leave it alone. A thread can only touch the
//! variable by name after executing its declaration, so no thread's write is erased.
//!
//! Rewritten: `__shared__ [__align__(N)] TYPE NAME[dims]...;` and the scalar
//! `__shared__ TYPE NAME;`, where the declaration starts a statement (after `;`, `{`, `}` or at
//! the start of the file; `volatile` and `__align__(N)` may come before `__shared__`). Dims are
//! anything balanced (`A > B ? A : B`, `tc::SMEM_BYTES`, macro calls). Left unpoisoned, rather
//! than rewritten into code that might not compile: `extern __shared__` (dynamic shared
//! memory, which the runtime poisons itself), text in comments, string literals and
//! preprocessor lines (a `#define` that contains `__shared__`), several declarators
//! (`__shared__ float a[4], b[4];`), an initializer, and any declaration that is not a
//! statement of its own (`if (c) __shared__ ...`, after a `case` label) or that this parser
//! does not follow. A declaration at namespace scope gets the call too, which compiles there but
//! runs once, at static initialisation, outside any launch: it does nothing, so namespace-scope
//! shared memory is not poisoned. Headers are not rewritten ([`Emulator`](crate::Emulator)
//! rewrites the sources it compiles, not what they include): shared memory declared in a
//! `.cuh` is not poisoned (the repository's kernels declare it in `.cu` files only).
//!
//! One kind of rewritten declaration does not compile: one inside a `switch` with a `case`
//! label after it, which would jump over the added local's initialisation (C++ forbids a jump
//! past an initialised local). Declare shared memory before the `switch`.

/// What the rewrite adds after a declaration's `;`: the macro `cuda_emu.h` defines.
const MACRO: &str = "TL_EMU_SHARED_POISON";

/// `src` with ` TL_EMU_SHARED_POISON(NAME);` after the `;` of each static `__shared__`
/// declaration it can parse (the module's documentation lists which), on the same line: the
/// result has the same lines as `src`, each declaration's followed by the call.
pub(crate) fn poison_shared(src: &str) -> String {
    let code = blank(src.as_bytes());
    let mut out = String::with_capacity(src.len() + 64);
    let mut copied = 0;
    let mut i = 0;
    while let Some(at) = find_word(&code, i, b"__shared__") {
        i = at + b"__shared__".len();
        if !starts_statement(&code, at) {
            continue;
        }
        if let Some((name, end)) = declaration(&code, i) {
            out.push_str(&src[copied..end]);
            out.push_str(&format!(" {MACRO}({name});"));
            copied = end;
            i = end;
        }
    }
    out.push_str(&src[copied..]);
    out
}

/// `src` with every byte of a comment, a string or character literal and a preprocessor line
/// (with its continuation lines) replaced by a space, newlines kept: the code alone, at the same
/// offsets.
fn blank(src: &[u8]) -> Vec<u8> {
    #[derive(PartialEq)]
    enum State {
        Code,
        LineComment,
        BlockComment,
        Literal(u8),
    }
    let mut code = src.to_vec();
    let mut state = State::Code;
    // In a preprocessor directive (until a newline not escaped by `\`), and whether only
    // blanks have come since the last newline (a `#` there starts a directive).
    let (mut directive, mut line_start) = (false, true);
    let mut i = 0;
    while i < src.len() {
        let c = src[i];
        let next = src.get(i + 1).copied();
        let mut blank_it = true;
        match state {
            State::Code => {
                let crlf = next == Some(b'\r') && src.get(i + 2) == Some(&b'\n');
                if c == b'\\' && (next == Some(b'\n') || crlf) {
                    // A line continuation: the directive (if any) goes on on the next line.
                    code[i] = b' ';
                    if crlf {
                        code[i + 1] = b' ';
                        i += 1;
                    }
                    i += 2;
                    continue;
                } else if c == b'\n' {
                    directive = false;
                    line_start = true;
                    blank_it = false;
                } else if c == b'/' && next == Some(b'/') {
                    state = State::LineComment;
                } else if c == b'/' && next == Some(b'*') {
                    state = State::BlockComment;
                    code[i] = b' ';
                    i += 1;
                } else if c == b'"' || (c == b'\'' && !(i > 0 && src[i - 1].is_ascii_digit())) {
                    // A digit before `'` is C++14's digit separator (`1'000`), not a literal.
                    state = State::Literal(c);
                    line_start = false;
                } else {
                    if line_start && c == b'#' {
                        directive = true;
                    }
                    if !c.is_ascii_whitespace() {
                        line_start = false;
                    }
                    blank_it = directive;
                }
            }
            State::LineComment => {
                if c == b'\n' {
                    state = State::Code;
                    directive = false;
                    line_start = true;
                    blank_it = false;
                }
            }
            State::BlockComment => {
                if c == b'*' && next == Some(b'/') {
                    state = State::Code;
                    code[i] = b' ';
                    i += 1;
                } else if c == b'\n' {
                    blank_it = false;
                }
            }
            State::Literal(q) => {
                if c == b'\\' && next.is_some_and(|n| n != b'\n') {
                    code[i] = b' ';
                    i += 1;
                } else if c == q {
                    state = State::Code;
                } else if c == b'\n' {
                    // An unterminated literal ends with its line (the compiler will say so).
                    state = State::Code;
                    directive = false;
                    line_start = true;
                    blank_it = false;
                }
            }
        }
        if blank_it && c != b'\n' {
            code[i] = b' ';
        }
        i += 1;
    }
    code
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// The offset of the next whole word `word` in `code` at or after `from`.
fn find_word(code: &[u8], from: usize, word: &[u8]) -> Option<usize> {
    let mut i = from;
    while i + word.len() <= code.len() {
        if code[i..].starts_with(word)
            && (i == 0 || !is_ident(code[i - 1]))
            && code.get(i + word.len()).is_none_or(|&c| !is_ident(c))
        {
            return Some(i);
        }
        i += 1;
    }
    None
}

/// Whether the declaration whose `__shared__` is at `at` starts a statement: before it, past
/// `volatile` and `__align__(N)` / `__attribute__((...))` / `alignas(N)`, come `;`, `{`, `}`
/// or the start of the file. False for `extern __shared__`, `if (c) __shared__`,
/// `case 1: __shared__`, ...
fn starts_statement(code: &[u8], at: usize) -> bool {
    let mut i = at;
    loop {
        while i > 0 && code[i - 1].is_ascii_whitespace() {
            i -= 1;
        }
        if i == 0 {
            return true;
        }
        match code[i - 1] {
            b';' | b'{' | b'}' => return true,
            b')' => {
                // An attribute's argument list: back to its `(`, then its name.
                let mut depth = 0usize;
                loop {
                    i -= 1;
                    match code[i] {
                        b')' => depth += 1,
                        b'(' => {
                            depth -= 1;
                            if depth == 0 {
                                break;
                            }
                        }
                        _ => {}
                    }
                    if i == 0 {
                        return false;
                    }
                }
                while i > 0 && code[i - 1].is_ascii_whitespace() {
                    i -= 1;
                }
                let word = word_before(code, i);
                if !matches!(word, "__align__" | "__attribute__" | "alignas") {
                    return false;
                }
                i -= word.len();
            }
            _ => {
                let word = word_before(code, i);
                if word != "volatile" {
                    return false;
                }
                i -= word.len();
            }
        }
    }
}

/// The identifier that ends at `end` in `code` (empty if none).
fn word_before(code: &[u8], end: usize) -> &str {
    let mut s = end;
    while s > 0 && is_ident(code[s - 1]) {
        s -= 1;
    }
    std::str::from_utf8(&code[s..end]).unwrap_or("")
}

/// A token of a declaration: an identifier, a bracketed group (`(...)`, `[...]`, balanced;
/// its opening character) or one other character (`::` is two `:`).
#[derive(Debug, PartialEq)]
enum Token<'a> {
    Ident(&'a str),
    Group(u8),
    Punct(u8),
}

/// The next token of `code` at or after `i` and the offset past it; `None` at the end, at a
/// brace, or at an unbalanced group.
fn token(code: &[u8], mut i: usize) -> Option<(Token<'_>, usize)> {
    while i < code.len() && code[i].is_ascii_whitespace() {
        i += 1;
    }
    let c = *code.get(i)?;
    if is_ident(c) {
        let s = i;
        while i < code.len() && is_ident(code[i]) {
            i += 1;
        }
        let word = std::str::from_utf8(&code[s..i]).ok()?;
        return Some((Token::Ident(word), i));
    }
    match c {
        b'(' | b'[' => {
            let mut stack = vec![c];
            let mut j = i + 1;
            while let Some(open) = stack.last().copied() {
                let d = *code.get(j)?;
                match d {
                    b'(' | b'[' => stack.push(d),
                    b')' | b']' => {
                        if (open, d) != (b'(', b')') && (open, d) != (b'[', b']') {
                            return None;
                        }
                        stack.pop();
                    }
                    b'{' | b'}' | b';' => return None,
                    _ => {}
                }
                j += 1;
            }
            Some((Token::Group(c), j))
        }
        b'{' | b'}' | b')' | b']' => None,
        _ => Some((Token::Punct(c), i + 1)),
    }
}

/// The attribute names that take a parenthesised argument in a declaration.
fn is_attribute(word: &str) -> bool {
    matches!(word, "__align__" | "__attribute__" | "alignas")
}

/// The declaration that follows `__shared__` (its end at `i`): `TYPE NAME [dims]... ;`, with
/// attributes (`__align__(N)`) before the type or after the dims. Its name and the offset past
/// its `;`, or `None` for anything else (several declarators, an initializer, a brace, ...).
fn declaration(code: &[u8], mut i: usize) -> Option<(&str, usize)> {
    // The type and the name: identifiers, `::`, `*`, `&` and template arguments `<...>`
    // (commas and parentheses only inside those); the name is the last identifier.
    let mut angle = 0usize;
    let mut words = 0usize;
    let mut name: Option<&str> = None;
    let mut attribute = false;
    let (first, mut after) = loop {
        let (t, next) = token(code, i)?;
        if attribute && t != Token::Group(b'(') {
            return None;
        }
        match t {
            Token::Ident(w) => {
                attribute = is_attribute(w);
                if !attribute {
                    words += 1;
                    name = Some(w);
                }
            }
            Token::Group(b'(') if attribute || angle > 0 => {
                attribute = false;
                name = None;
            }
            Token::Punct(b':' | b'*' | b'&') => name = None,
            Token::Punct(b',') if angle > 0 => {}
            Token::Punct(b'<') => {
                angle += 1;
                name = None;
            }
            Token::Punct(b'>') if angle > 0 => angle -= 1,
            Token::Group(b'[') | Token::Punct(b';') if angle == 0 && !attribute => {
                break (t, next);
            }
            _ => return None,
        }
        i = next;
    };
    // At least one word of type before the name.
    let name = name.filter(|_| words >= 2)?;
    if first == Token::Punct(b';') {
        return Some((name, after));
    }
    // The dims, then attributes, then `;`.
    let mut attribute = false;
    let mut dims = true;
    loop {
        let (t, next) = token(code, after)?;
        match t {
            Token::Group(b'[') if dims => {}
            Token::Ident(w) if is_attribute(w) && !attribute => {
                attribute = true;
                dims = false;
            }
            Token::Group(b'(') if attribute => attribute = false,
            Token::Punct(b';') if !attribute => return Some((name, next)),
            _ => return None,
        }
        after = next;
    }
}

#[cfg(test)]
mod tests {
    use super::poison_shared;

    /// `src` rewritten, checking that it keeps its lines.
    fn rw(src: &str) -> String {
        let out = poison_shared(src);
        assert_eq!(out.lines().count(), src.lines().count(), "{out}");
        out
    }

    #[test]
    fn an_array_gets_the_call_after_its_semicolon() {
        assert_eq!(
            rw("    __shared__ float smem[33];\n    smem[0] = 1;\n"),
            "    __shared__ float smem[33]; TL_EMU_SHARED_POISON(smem);\n    smem[0] = 1;\n"
        );
    }

    #[test]
    fn aligned_multi_dimensional_and_scalar_declarations() {
        assert_eq!(
            rw("{ __shared__ __align__(16) float As[2][BK][BM + 4];\n"),
            "{ __shared__ __align__(16) float As[2][BK][BM + 4]; TL_EMU_SHARED_POISON(As);\n"
        );
        assert_eq!(
            rw("__align__(32) __shared__ unsigned char bytes[64];"),
            "__align__(32) __shared__ unsigned char bytes[64]; TL_EMU_SHARED_POISON(bytes);"
        );
        assert_eq!(
            rw("x = 1; __shared__ unsigned int total;"),
            "x = 1; __shared__ unsigned int total; TL_EMU_SHARED_POISON(total);"
        );
        assert_eq!(
            rw("; __shared__ float tile[32][33] __align__(16);"),
            "; __shared__ float tile[32][33] __align__(16); TL_EMU_SHARED_POISON(tile);"
        );
        assert_eq!(
            rw("; volatile __shared__ float* volatile p;"),
            "; volatile __shared__ float* volatile p; TL_EMU_SHARED_POISON(p);"
        );
        assert_eq!(
            rw("; __shared__ ns::Pair<float, sizeof(int)> pairs[4];"),
            "; __shared__ ns::Pair<float, sizeof(int)> pairs[4]; TL_EMU_SHARED_POISON(pairs);"
        );
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
            assert_eq!(rw(&src), want);
        }
    }

    #[test]
    fn a_declaration_over_several_lines_keeps_them() {
        let src = "{ __shared__ float\n    big[4]\n    [8];\n}";
        assert_eq!(
            rw(src),
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

    #[test]
    fn extern_shared_is_left_alone() {
        for src in [
            "; extern __shared__ float dyn[];",
            "; extern __shared__ __align__(16) float dyn[];",
            "; extern \"C\" __shared__ float dyn[];",
        ] {
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
            assert_eq!(rw(src), src);
        }
        // After a directive and its continuation, code is code again; a `'` after a digit is a
        // digit separator, not a character literal.
        assert_eq!(
            rw("#define A \\\n  1\n__shared__ float a[1'000];\n"),
            "#define A \\\n  1\n__shared__ float a[1'000]; TL_EMU_SHARED_POISON(a);\n"
        );
        assert_eq!(
            rw("#define DECL(n) \\\r\n    __shared__ float n[4];\r\n__shared__ float b[4];\r\n"),
            "#define DECL(n) \\\r\n    __shared__ float n[4];\r\n\
             __shared__ float b[4]; TL_EMU_SHARED_POISON(b);\r\n"
        );
        assert_eq!(
            rw("/* x */ __shared__ float a[4];"),
            "/* x */ __shared__ float a[4]; TL_EMU_SHARED_POISON(a);"
        );
    }

    /// What the rewrite does not follow stays as it was (unpoisoned, and compiling).
    #[test]
    fn declarations_it_cannot_parse_are_left_alone() {
        for src in [
            "; __shared__ float a[4], b[4];",
            "; __shared__ float a, b;",
            "; __shared__ int n = 0;",
            "; __shared__ struct { float x; } s;",
            "; __shared__ float a[4]",
            "; __shared__ float a[4;",
            "; __shared__ a[4];",
            "; __shared__ float (*f)(int);",
            "if (c) __shared__ float a[4];",
            "case 1: __shared__ float a[4];",
            "; static __shared__ float a[4];",
            "; __shared__ float a[4] = {0};",
            "; __shared__ float a[4] __align__;",
        ] {
            assert_eq!(rw(src), src);
        }
        // Past one it cannot parse, the next is still rewritten.
        assert_eq!(
            rw("; __shared__ float a[4], b[4]; __shared__ float c[4];"),
            "; __shared__ float a[4], b[4]; __shared__ float c[4]; TL_EMU_SHARED_POISON(c);"
        );
    }

    #[test]
    fn the_repositorys_declarations_are_all_rewritten() {
        let src = "__shared__ __nv_bfloat16 as[2 * 256];\n\
                   __shared__ float tile[32][33];\n\
                   __shared__ float s[TL_BLOCK];\n";
        let out = rw(src);
        for name in ["as", "tile", "s"] {
            assert!(
                out.contains(&format!("TL_EMU_SHARED_POISON({name});")),
                "{out}"
            );
        }
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
            rw("// ×\n__shared__ float a[4]; // ⌈n⌉\n"),
            "// ×\n__shared__ float a[4]; TL_EMU_SHARED_POISON(a); // ⌈n⌉\n"
        );
    }
}
