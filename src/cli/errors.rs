//! How the command prints an error: one line, the chain of causes joined by ": ", each
//! cause once, and every echoed value cut to a readable length.
//!
//! Some error types in the workspace write their cause into their own message *and*
//! return it as [`std::error::Error::source`]; printed naively, such a chain repeats a
//! cause two or three times. [`chain`] skips a cause whose text its parent's message
//! already holds. Values echoed from the input (a 1 MB tenant name, a whole table) are
//! cut by [`shorten`] to [`VALUE_LIMIT`] characters plus `… (N bytes)`.
//!
//! This module only formats: it does not decide what is an error or the exit status.

use std::borrow::Cow;
use std::fmt::Write as _;

/// Characters of an echoed value kept in a message.
pub const VALUE_LIMIT: usize = 80;

/// A line longer than this is cut, whatever it holds (a value that is not quoted).
pub const LINE_LIMIT: usize = 400;

/// The error and its causes, `top: cause: cause`, each cause once, values shortened.
pub fn chain(e: &anyhow::Error) -> String {
    let mut out = String::new();
    let mut parent: Option<String> = None;
    for cause in e.chain() {
        let text = cause.to_string();
        let text = text.trim();
        if text.is_empty() {
            continue;
        }
        // The parent already says it (its message embeds its source's).
        if parent.as_deref().is_some_and(|p| p.contains(text)) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(text);
        parent = Some(text.to_owned());
    }
    shorten(&out).into_owned()
}

/// `msg` with every quoted value (`"…"` or `` `…` ``) longer than
/// [`VALUE_LIMIT`] characters cut to that many plus `… (N bytes)`, and every line
/// longer than [`LINE_LIMIT`] characters cut the same way.
pub fn shorten(msg: &str) -> Cow<'_, str> {
    if msg.len() <= VALUE_LIMIT {
        return Cow::Borrowed(msg);
    }
    let mut out = String::with_capacity(msg.len().min(4 * LINE_LIMIT));
    let mut rest = msg;
    while let Some(open) = rest.find(['"', '`']) {
        let quote = rest[open..].chars().next().unwrap_or('"');
        out.push_str(&rest[..=open]);
        let after = &rest[open + 1..];
        let close = closing_quote(after, quote);
        let (value, tail) = match close {
            Some(end) => (&after[..end], &after[end..]),
            None => (after, ""),
        };
        out.push_str(&cut(value, VALUE_LIMIT));
        rest = tail;
        if let Some(c) = rest.chars().next() {
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    out.push_str(rest);
    if out.lines().all(|l| l.chars().count() <= LINE_LIMIT) {
        return Cow::Owned(out);
    }
    let mut lines = String::with_capacity(out.len().min(4 * LINE_LIMIT));
    for (i, line) in out.split('\n').enumerate() {
        if i > 0 {
            lines.push('\n');
        }
        if line.chars().count() > LINE_LIMIT {
            lines.push_str(&cut(line, LINE_LIMIT));
        } else {
            lines.push_str(line);
        }
    }
    Cow::Owned(lines)
}

/// The index of the quote closing a value that started right before `s` (a backslash
/// escapes the next character).
fn closing_quote(s: &str, quote: char) -> Option<usize> {
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            c if c == quote => return Some(i),
            _ => {}
        }
    }
    None
}

/// `value` itself when it has at most `limit` characters, else its first `limit`
/// characters and `… (N bytes)`.
fn cut(value: &str, limit: usize) -> Cow<'_, str> {
    match value.char_indices().nth(limit) {
        None => Cow::Borrowed(value),
        Some((at, _)) => {
            let mut s = value[..at].to_owned();
            let _ = write!(s, "… ({} bytes)", value.len());
            Cow::Owned(s)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer: {source}")]
    struct Outer {
        source: Inner,
    }

    #[derive(Debug, thiserror::Error)]
    #[error("inner: {0}")]
    struct Inner(#[source] std::io::Error);

    #[test]
    fn a_cause_already_in_its_parents_message_is_printed_once() {
        let io = std::io::Error::from(std::io::ErrorKind::NotFound);
        let e = anyhow::Error::new(Outer { source: Inner(io) }).context("a.pcap");
        assert_eq!(chain(&e), "a.pcap: outer: inner: entity not found");
    }

    #[test]
    fn causes_that_are_not_repeated_are_all_printed() {
        let e = anyhow::anyhow!("root").context("middle").context("top");
        assert_eq!(chain(&e), "top: middle: root");
    }

    #[test]
    fn long_values_are_cut_and_short_ones_kept() {
        let long = "a".repeat(1 << 20);
        let msg = format!("tenant 7 ({long:?}): invalid prefix \"10.0.0.0/33\"");
        let s = shorten(&msg);
        assert!(s.len() < 200, "{s}");
        assert!(
            s.contains(&format!("\"{}… (1048576 bytes)\"", "a".repeat(80))),
            "{s}"
        );
        assert!(s.ends_with("invalid prefix \"10.0.0.0/33\""), "{s}");
        assert_eq!(shorten("short \"x\""), "short \"x\"");
        let unquoted = "b".repeat(5000);
        let s = shorten(&unquoted);
        assert!(s.ends_with("… (5000 bytes)") && s.len() < 500, "{s}");
        // An escaped quote does not end the value.
        let msg = format!("v \"{}\\\"{}\" end", "c".repeat(100), "d".repeat(100));
        assert!(shorten(&msg).ends_with("bytes)\" end"), "{}", shorten(&msg));
    }
}
