//! The emulator build's rewrite of a `.cu` source (or a header it includes) so that its static
//! shared memory starts each block poisoned, as dynamic shared memory does (docs/cuda.md, "The
//! kernel emulator").
//!
//! In the emulator `__shared__` is `static thread_local` (`cuda_emu.h`): without help a static
//! shared variable starts at 0 and keeps the previous block's values, so a kernel that reads it
//! before writing it looks right there and gives garbage on a GPU, where shared memory is
//! undefined at a block's start. A macro cannot reach the variable's name, so [`poison_shared`]
//! rewrites the source: after each declaration's `;`, on the same line (line numbers stay), it
//! adds one call per declarator, ` MACRO(NAME);`, the macro chosen by where the declaration is:
//!
//! - **In a function** (a block of statements): `TL_EMU_SHARED_POISON(NAME)`, a declaration
//!   whose initializer calls the runtime's `tl_emu_shared_poison`: the first thread of a block
//!   to execute it fills the variable with 0xFF bytes (a NaN), later ones (and later passes in
//!   the same block) leave it alone. A thread can only reach code that names the variable by
//!   passing its declaration, because C++ forbids a jump past an initialised local: so no
//!   thread's write is erased.
//! - **In a function, with a label after it in its block** (a `case` or `default` of the
//!   `switch` it is in, or a `goto` label), where that local would not compile (the label
//!   would jump over its initialisation): `TL_EMU_SHARED_POISON_JUMPABLE(NAME)`, an expression
//!   statement that registers the variable (`tl_emu_shared_poison_jumpable`) for the running
//!   kernel on the launching thread without touching it; the runtime fills every registered
//!   variable at the start of each later block of that kernel, before any of its threads runs.
//!   A thread that jumps to the label may write the variable before any other passes the
//!   declaration, so filling it there could erase that write: the block in which the launching
//!   thread first passes the declaration runs unpoisoned (in a fresh thread, from 0).
//! - **At namespace scope** (in the file, a `namespace` or an `extern "C" { }`), where no
//!   statement runs: `TL_EMU_SHARED_POISON_EACH_BLOCK(NAME)`, a static whose initialisation
//!   (at program start) adds a function returning the variable's address and size to its
//!   translation unit's list; the runtime fills each variable of the running kernel's unit at
//!   the start of every block, before any of its threads runs.
//!
//! Parsed: `__shared__ [__align__(N)] TYPE DECLARATOR, DECLARATOR...;` where the first
//! declarator is `NAME[dims]... [__align__(N)]` after the type (pointers `*` in the type), and
//! each further one `[*|&|const|volatile]... NAME[dims]... [__align__(N)]`: arrays of any
//! rank, scalars and pointers; the declaration starting a statement (after `;`, `{`, `}`, a
//! label `case X:`, `default:` or `name:`, or at the start of the file; `volatile` and
//! `__align__(N)` / `__attribute__((...))` / `alignas(N)` may come before `__shared__`). Dims
//! are anything balanced (`A > B ? A : B`, `tc::SMEM_BYTES`, macro calls); the type may be
//! qualified and templated (`ns::Pair<float, sizeof(int)>`). Where a declaration is comes from
//! the braces around it: a `{` after `namespace ...` or `extern "C"` opens a namespace scope; one
//! whose head ends with `)`, `]` or a qualifier (`const`, `mutable`, ...) a function's or a
//! lambda's body; one inside parentheses, or whose head holds `struct`, `class`, `union`,
//! `enum` or `=`, or ends with `,` or `return`, a class body or an initializer (as is any
//! other inside those); any other (`do {`, `else {`, `case 1: {`, `{`) a block of statements.
//!
//! Left unpoisoned, rather than rewritten into code that might not compile or might compile to
//! something else: `extern __shared__` (dynamic shared memory, which the runtime poisons
//! itself); text in comments, string literals and preprocessor lines (a `#define` that
//! contains `__shared__`: a declaration a macro expands to is not seen); a declaration with an
//! initializer, any declarator this parser does not follow (`(*f)(int)`, an attribute before a
//! later declarator's name), a declaration that is not a statement of its own
//! (`if (c) __shared__ ...`); one in a class body, or in braces this parser takes for one
//! (a lambda passed as an argument, a member function with a trailing return type); and every
//! declaration of a file whose braces do not balance outside comments,
//! literals and preprocessor lines (`#if` / `#else` branches that each open a brace), where
//! scopes cannot be told apart. [`Emulator`](crate::Emulator) applies the rewrite to each
//! source and to each header it includes with `#include "..."` (found next to the including
//! file or in the include directories); a header included with `<...>` is compiled as it is.

use std::fmt::Write as _;

use scopes::{Kind, Scopes, statement_start};

/// The call after a declaration in a block of statements: poisons at the block's first pass.
const POISON: &str = "TL_EMU_SHARED_POISON";
/// The call after a declaration in a block of statements with a label after it: registers the
/// variable, poisoned at the start of later blocks.
const POISON_JUMPABLE: &str = "TL_EMU_SHARED_POISON_JUMPABLE";
/// The call after a declaration at namespace scope: poisoned at the start of every block.
const POISON_EACH_BLOCK: &str = "TL_EMU_SHARED_POISON_EACH_BLOCK";

/// The macros the rewrite calls (each must be defined by `cuda_emu.h`).
#[cfg(test)]
pub(crate) const MACROS: [&str; 3] = [POISON, POISON_JUMPABLE, POISON_EACH_BLOCK];

/// `src` with ` MACRO(NAME);` after the `;` of each static `__shared__` declaration it can
/// parse, once per declarator (the module's documentation lists which, and which macro), on the
/// same line: the result has the same lines as `src`.
pub(crate) fn poison_shared(src: &str) -> String {
    let code = blank(src.as_bytes());
    let Some(scopes) = Scopes::of(&code) else {
        return src.to_owned();
    };
    let mut out = String::with_capacity(src.len() + 64);
    let mut copied = 0;
    let mut i = 0;
    while let Some(at) = find_word(&code, i, b"__shared__") {
        i = at + b"__shared__".len();
        if !starts_statement(&code, at) {
            continue;
        }
        let Some((names, end)) = declaration(&code, i) else {
            continue;
        };
        let call = match scopes.at(at) {
            (Kind::Namespace, _) => POISON_EACH_BLOCK,
            (Kind::Code, Some(b)) if scopes.label_after(&code, b, end) => POISON_JUMPABLE,
            (Kind::Code, _) => POISON,
            (Kind::Other, _) => continue,
        };
        out.push_str(&src[copied..end]);
        for name in names {
            let _ = write!(out, " {call}({name});");
        }
        copied = end;
        i = end;
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
/// `volatile` and `__align__(N)` / `__attribute__((...))` / `alignas(N)`, come `;`, `{`, `}`,
/// a label (`case X:`, `default:`, `name:`) or the start of the file. False for
/// `extern __shared__`, `if (c) __shared__`, `x ? __shared__`, ...
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
            b':' => return i >= 2 && code[i - 2] != b':' && is_label(code, i - 1),
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

/// Whether the `:` at `colon` ends labels that start a statement: from the statement's start
/// (after `;`, `{`, `}` or the file's start) to `colon`, either `case ...` / `default` first or
/// identifiers separated by single `:` only (`a: b:`).
fn is_label(code: &[u8], colon: usize) -> bool {
    let s = statement_start(code, colon);
    let head = &code[s..colon];
    let first = head
        .split(|c| !is_ident(*c))
        .find(|w| !w.is_empty())
        .unwrap_or(b"");
    if first == b"case" || first == b"default" {
        return true;
    }
    // Goto labels: identifiers and single colons (not `::`, not `?`).
    !first.is_empty()
        && !head.windows(2).any(|w| w == b"::")
        && head
            .iter()
            .all(|&c| is_ident(c) || c == b':' || c.is_ascii_whitespace())
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

/// The declaration that follows `__shared__` (its end at `i`): `TYPE DECLARATOR, ...;`, with
/// attributes (`__align__(N)`) before the type or after a declarator's dims. Its declarators'
/// names and the offset past its `;`, or `None` for anything else (an initializer, a brace, a
/// declarator it does not follow, ...).
fn declaration(code: &[u8], mut i: usize) -> Option<(Vec<&str>, usize)> {
    // The type and the first name: identifiers, `::`, `*`, `&` and template arguments `<...>`
    // (commas and parentheses only inside those); the name is the last identifier.
    let mut angle = 0usize;
    let mut words = 0usize;
    let mut name: Option<&str> = None;
    let mut attribute = false;
    loop {
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
            Token::Group(b'[') | Token::Punct(b';' | b',') if angle == 0 => break,
            _ => return None,
        }
        i = next;
    }
    // At least one word of type before the name.
    let mut names = vec![name.filter(|_| words >= 2)?];
    loop {
        let (last, next) = declarator_rest(code, i)?;
        if last {
            return Some((names, next));
        }
        let (name, after) = declarator_name(code, next)?;
        names.push(name);
        i = after;
    }
}

/// A further declarator's name after its `*`, `&` and qualifiers (from `i`, past the `,`), and
/// the offset past the name; `None` if something else comes first.
fn declarator_name(code: &[u8], mut i: usize) -> Option<(&str, usize)> {
    loop {
        let (t, next) = token(code, i)?;
        match t {
            Token::Punct(b'*' | b'&') => {}
            Token::Ident("const" | "volatile" | "__restrict__" | "__restrict") => {}
            Token::Ident(w) if !is_attribute(w) => return Some((w, next)),
            _ => return None,
        }
        i = next;
    }
}

/// The rest of a declarator after its name (from `i`): dims, then attributes, then `,` (false)
/// or `;` (true), and the offset past that; `None` for anything else.
fn declarator_rest(code: &[u8], mut i: usize) -> Option<(bool, usize)> {
    let mut attribute = false;
    let mut dims = true;
    loop {
        let (t, next) = token(code, i)?;
        match t {
            Token::Group(b'[') if dims => {}
            Token::Ident(w) if is_attribute(w) && !attribute => {
                attribute = true;
                dims = false;
            }
            Token::Group(b'(') if attribute => attribute = false,
            Token::Punct(b';') if !attribute => return Some((true, next)),
            Token::Punct(b',') if !attribute => return Some((false, next)),
            _ => return None,
        }
        i = next;
    }
}

mod scopes;
#[cfg(test)]
mod tests;
