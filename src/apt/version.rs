//! Debian version ordering, dpkg's rules.

use std::cmp::Ordering;

/// Compares two Debian versions as dpkg does: epoch, then upstream version,
/// then revision, each by dpkg's alternating non-digit/digit rule where `~`
/// sorts before everything, even the end of the string.
pub(crate) fn compare_versions(a: &str, b: &str) -> Ordering {
    let (ea, ua, ra) = split_version(a);
    let (eb, ub, rb) = split_version(b);
    ea.cmp(&eb)
        .then_with(|| compare_part(ua, ub))
        .then_with(|| compare_part(ra, rb))
}

fn split_version(v: &str) -> (u64, &str, &str) {
    let (epoch, rest) = match v.split_once(':') {
        Some((e, rest)) if e.bytes().all(|b| b.is_ascii_digit()) => (e.parse().unwrap_or(0), rest),
        _ => (0, v),
    };
    match rest.rsplit_once('-') {
        Some((up, rev)) => (epoch, up, rev),
        None => (epoch, rest, ""),
    }
}

fn char_order(c: Option<u8>) -> i32 {
    match c {
        None => 0,
        Some(b'~') => -1,
        Some(c) if c.is_ascii_alphabetic() => i32::from(c),
        Some(c) => i32::from(c) + 256,
    }
}

fn compare_part(a: &str, b: &str) -> Ordering {
    let (mut a, mut b) = (a.as_bytes(), b.as_bytes());
    while !a.is_empty() || !b.is_empty() {
        // Non-digit prefixes, character by character.
        loop {
            let ca = a.first().copied().filter(|c| !c.is_ascii_digit());
            let cb = b.first().copied().filter(|c| !c.is_ascii_digit());
            if ca.is_none() && cb.is_none() {
                break;
            }
            let ord = char_order(ca).cmp(&char_order(cb));
            if ord != Ordering::Equal {
                return ord;
            }
            a = &a[1..];
            b = &b[1..];
        }
        // Digit runs, numerically (leading zeros ignored, no overflow).
        let da = a.iter().take_while(|c| c.is_ascii_digit()).count();
        let db = b.iter().take_while(|c| c.is_ascii_digit()).count();
        let (na, nb) = (trim_zeros(&a[..da]), trim_zeros(&b[..db]));
        let ord = na.len().cmp(&nb.len()).then_with(|| na.cmp(nb));
        if ord != Ordering::Equal {
            return ord;
        }
        a = &a[da..];
        b = &b[db..];
    }
    Ordering::Equal
}

fn trim_zeros(d: &[u8]) -> &[u8] {
    let n = d.iter().take_while(|&&c| c == b'0').count();
    &d[n..]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_compare_like_dpkg() {
        use Ordering::*;
        for (a, b, want) in [
            ("6.1.176-1", "6.1.176-1", Equal),
            ("6.1.176-1", "6.1.99-1", Greater),
            ("6.1.176-1", "6.1.176-2", Less),
            ("1:0.1", "2.0", Greater),
            ("1.0~rc1-1", "1.0-1", Less),
            ("1.0~rc1", "1.0~", Greater),
            ("1.0", "1.0-0", Equal),
            ("6.12.117-1", "6.12.107-1", Greater),
            ("1.0a", "1.0+", Less),
            ("1.0", "1.0.0", Less),
            ("1.007", "1.7", Equal),
            ("1.0+b1", "1.0", Greater),
        ] {
            assert_eq!(compare_versions(a, b), want, "{a} vs {b}");
            assert_eq!(compare_versions(b, a), want.reverse(), "{b} vs {a}");
        }
    }
}
