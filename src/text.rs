//! Cutting text for messages, logs and API fields without splitting a
//! UTF-8 character.

/// The longest prefix of `s` of at most `max` bytes that ends on a char
/// boundary.
pub fn prefix(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut n = max;
    while !s.is_char_boundary(n) {
        n -= 1;
    }
    &s[..n]
}

/// `s` cut to at most `max` bytes (plus "…" when cut).
pub fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        s.to_string()
    } else {
        format!("{}…", prefix(s, max))
    }
}

/// The last `n` non-empty lines of `s`, trimmed, joined with " | ": the
/// shape of an external tool's stderr quoted in one message line.
pub fn tail_lines(s: &str, n: usize) -> String {
    let mut lines: Vec<&str> = s
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .rev()
        .take(n)
        .collect();
    lines.reverse();
    lines.join(" | ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_on_char_boundaries() {
        assert_eq!(truncate("abc", 3), "abc");
        assert_eq!(truncate("abcd", 3), "abc…");
        // 'é' is two bytes: a cut at 2 would split it.
        assert_eq!(truncate("aéb", 2), "a…");
        assert_eq!(prefix("aéb", 2), "a");
        assert_eq!(prefix("", 0), "");
    }

    #[test]
    fn tails() {
        assert_eq!(tail_lines("a\n\nb\nc\n", 2), "b | c");
        assert_eq!(tail_lines("", 5), "");
        assert_eq!(tail_lines("  x  \n", 5), "x");
    }
}
