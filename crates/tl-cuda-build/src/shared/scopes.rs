//! Where a declaration is: the pairs of braces of a file's code, each a namespace scope, a
//! block of statements or something else (a class body, an initializer), and the labels a
//! jump could reach in a block.

use super::{find_word, is_ident, is_label};

/// What a pair of braces holds, for the declarations in it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Kind {
    /// Declarations of a namespace (the file, `namespace N { }`, `extern "C" { }`).
    Namespace,
    /// Statements (a function body and the blocks in it).
    Code,
    /// A class body, an initializer, or what this parser cannot tell: left alone.
    Other,
}

/// One pair of braces of a file: its offsets, what it holds, whether it is a `switch`'s body,
/// and the braces around it.
#[derive(Debug)]
struct Brace {
    open: usize,
    close: usize,
    kind: Kind,
    switch_body: bool,
    parent: Option<usize>,
}

/// Every pair of braces of a file's code, in the order they open.
pub(super) struct Scopes(Vec<Brace>);

impl Scopes {
    /// The braces of `code` (blanked: comments, literals and directives are spaces); `None`
    /// when braces, parentheses or brackets do not balance.
    pub(super) fn of(code: &[u8]) -> Option<Scopes> {
        let mut braces: Vec<Brace> = Vec::new();
        // The open braces, each with the parentheses open around it.
        let mut open: Vec<(usize, usize)> = Vec::new();
        let mut parens = 0usize;
        for (i, &c) in code.iter().enumerate() {
            match c {
                b'(' | b'[' => parens += 1,
                b')' | b']' => parens = parens.checked_sub(1)?,
                b'{' => {
                    let parent = open.last().map(|&(b, _)| b);
                    let outer = parent.map_or(Kind::Namespace, |p| braces[p].kind);
                    let (kind, switch_body) = if parens > 0 {
                        (Kind::Other, false)
                    } else {
                        classify(code, i, outer)
                    };
                    braces.push(Brace {
                        open: i,
                        close: code.len(),
                        kind,
                        switch_body,
                        parent,
                    });
                    open.push((braces.len() - 1, parens));
                    parens = 0;
                }
                b'}' => {
                    let (b, outer) = open.pop()?;
                    if parens != 0 {
                        return None;
                    }
                    braces[b].close = i;
                    parens = outer;
                }
                _ => {}
            }
        }
        (open.is_empty() && parens == 0).then_some(Scopes(braces))
    }

    /// The innermost braces around offset `p`, if any.
    fn innermost(&self, p: usize) -> Option<usize> {
        // Braces open in order and nest: the last one around `p` is the innermost.
        self.0.iter().rposition(|b| b.open < p && p < b.close)
    }

    /// What holds offset `p` (namespace scope outside every brace), and its braces.
    pub(super) fn at(&self, p: usize) -> (Kind, Option<usize>) {
        match self.innermost(p) {
            Some(b) => (self.0[b].kind, Some(b)),
            None => (Kind::Namespace, None),
        }
    }

    /// Whether a label a jump could reach comes after offset `from` in braces `b`: a `case` or
    /// `default` (not one of a `switch` nested in `b`) or a `goto` label (`name:` starting a
    /// statement).
    pub(super) fn label_after(&self, code: &[u8], b: usize, from: usize) -> bool {
        let to = self.0[b].close;
        let mut labels = Vec::new();
        for word in [&b"case"[..], b"default"] {
            let mut i = from;
            while let Some(at) = find_word(&code[..to], i, word) {
                labels.push(at);
                i = at + word.len();
            }
        }
        for q in from..to {
            if code[q] == b':'
                && code.get(q + 1) != Some(&b':')
                && q > 0
                && code[q - 1] != b':'
                && is_label(code, q)
            {
                labels.push(q);
            }
        }
        labels.into_iter().any(|p| {
            // Up from the label's braces to `b`: a switch on the way owns the label.
            let mut j = self.innermost(p);
            while let Some(k) = j {
                if k == b {
                    return true;
                }
                if self.0[k].switch_body {
                    return false;
                }
                j = self.0[k].parent;
            }
            false
        })
    }
}

/// A token of the head before a `{`: a word, or a punctuation character (a bracketed group is
/// its closing character).
#[derive(Debug, PartialEq)]
enum Head<'a> {
    Word(&'a str),
    Char(u8),
}

/// Where the statement holding `at` starts: just after the previous `;`, `{` or `}` outside
/// parentheses and brackets (0 at the file's start).
pub(super) fn statement_start(code: &[u8], at: usize) -> usize {
    let mut s = at;
    let mut depth = 0usize;
    while s > 0 {
        match code[s - 1] {
            b')' | b']' => depth += 1,
            b'(' | b'[' => depth = depth.saturating_sub(1),
            b';' | b'{' | b'}' if depth == 0 => break,
            _ => {}
        }
        s -= 1;
    }
    s
}

/// What the braces opening at `open` hold (`outer`: what holds them), and whether they are a
/// `switch`'s body: from the head before them, back to the previous `;`, `{` or `}`.
fn classify(code: &[u8], open: usize, outer: Kind) -> (Kind, bool) {
    let s = statement_start(code, open);
    let head = head_tokens(&code[s..open]);
    let word = |k: usize| match head.get(k) {
        Some(Head::Word(w)) => *w,
        _ => "",
    };
    let Some(last) = head.last() else {
        // `{ {`: a nested block in code, an initializer's element elsewhere.
        return (
            if outer == Kind::Code {
                Kind::Code
            } else {
                Kind::Other
            },
            false,
        );
    };
    let namespace_like = word(0) == "namespace"
        || (word(0) == "inline" && word(1) == "namespace")
        // `extern "C" {` (the string is blanked).
        || head == [Head::Word("extern")];
    if namespace_like {
        return (
            if outer == Kind::Namespace {
                Kind::Namespace
            } else {
                Kind::Other
            },
            false,
        );
    }
    // A function's or a lambda's body: after its parameters, captures or qualifiers (also
    // `auto f = [&]() {`, `T& operator=(const T&) {`).
    let body = matches!(
        last,
        Head::Char(b')' | b']')
            | Head::Word("const" | "noexcept" | "override" | "final" | "mutable")
    );
    let class_or_initializer = matches!(last, Head::Char(b',' | b'=') | Head::Word("return"))
        || head.iter().any(|t| {
            matches!(
                t,
                Head::Word("struct" | "class" | "union" | "enum") | Head::Char(b'=')
            )
        });
    // In a class body or an initializer, only a function or lambda body holds code.
    if !body && (class_or_initializer || outer == Kind::Other) {
        return (Kind::Other, false);
    }
    (Kind::Code, word(0) == "switch")
}

/// The words and punctuation of `head` outside brackets (a group is its closing character),
/// with the parameter list of `template <...>` left out; `==`, `!=`, `<=`, `>=` are not `=`.
fn head_tokens(head: &[u8]) -> Vec<Head<'_>> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < head.len() {
        let c = head[i];
        if is_ident(c) {
            let s = i;
            while i < head.len() && is_ident(head[i]) {
                i += 1;
            }
            let word = std::str::from_utf8(&head[s..i]).unwrap_or("");
            out.push(Head::Word(word));
            if word == "template" {
                while i < head.len() && head[i].is_ascii_whitespace() {
                    i += 1;
                }
                if head.get(i) == Some(&b'<') {
                    let mut angle = 0usize;
                    while i < head.len() {
                        match head[i] {
                            b'<' => angle += 1,
                            b'>' => {
                                angle -= 1;
                                if angle == 0 {
                                    i += 1;
                                    break;
                                }
                            }
                            _ => {}
                        }
                        i += 1;
                    }
                }
            }
            continue;
        }
        match c {
            b'(' | b'[' => {
                let close = if c == b'(' { b')' } else { b']' };
                let mut depth = 0usize;
                while i < head.len() {
                    match head[i] {
                        b'(' | b'[' => depth += 1,
                        b')' | b']' => {
                            depth -= 1;
                            if depth == 0 {
                                break;
                            }
                        }
                        _ => {}
                    }
                    i += 1;
                }
                out.push(Head::Char(close));
            }
            b'=' | b'!' | b'<' | b'>' if head.get(i + 1) == Some(&b'=') => {
                out.push(Head::Char(b'?'));
                i += 1;
            }
            _ if !c.is_ascii_whitespace() => out.push(Head::Char(c)),
            _ => {}
        }
        i += 1;
    }
    out
}
