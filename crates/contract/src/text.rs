//! Text for messages, logs and API fields: cuts that never split a UTF-8
//! character, stderr tails, and RFC 3339 timestamps.

use std::time::{SystemTime, UNIX_EPOCH};

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

/// RFC 3339 in UTC with second precision (`2026-12-02T13:21:05Z`), from the
/// civil-from-days algorithm (H. Hinnant): no time crate needed.
pub fn rfc3339_utc(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
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
