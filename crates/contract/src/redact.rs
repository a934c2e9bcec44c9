//! Credentials out of every output. A URL may carry a secret in its user
//! info (`https://user:pass@host/`, `s3://key:secret@bucket`) or in its
//! query (a presigned mirror URL's `X-Amz-Signature=`, a `token=`). The
//! installer prints URLs in results, messages, logs and the termination
//! log, and the operator copies messages into the API; all of them pass
//! through [`text`], which masks those parts wherever a URL appears in a
//! text, and [`RedactingWriter`] does the same for the log stream.
//!
//! Redacting at the output boundary, not where each message is built,
//! means that a message written tomorrow by someone who forgot is still
//! clean.

use std::borrow::Cow;
use std::io::Write;

/// What a masked part is replaced with.
pub const MASK: &str = "***";

/// Query parameter names (lower-case substrings) whose values are
/// credentials: AWS/GCS/Azure presigned URLs, OAuth and API tokens.
const SECRET_PARAMS: &[&str] = &[
    "sig",
    "token",
    "key",
    "secret",
    "pass",
    "credential",
    "auth",
    "session",
];

/// Characters that end a URL inside a message, a log line or JSON.
fn ends_url(c: char) -> bool {
    c.is_whitespace() || matches!(c, '"' | '\'' | '<' | '>' | '`' | '\\' | ')' | ']' | '}')
}

fn is_scheme_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'+' | b'-' | b'.')
}

/// `s` with the user info and secret query values of every URL in it
/// masked. Borrowed when nothing needed masking.
pub fn text(s: &str) -> Cow<'_, str> {
    if !s.contains("://") {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    let mut changed = false;
    while let Some(i) = rest.find("://") {
        // The scheme must be a word right before "://".
        let head = &rest.as_bytes()[..i];
        let scheme_len = head
            .iter()
            .rev()
            .take_while(|c| is_scheme_char(**c))
            .count();
        let after = i + 3;
        out.push_str(&rest[..after]);
        let tail = &rest[after..];
        let end = tail.find(ends_url).unwrap_or(tail.len());
        if scheme_len == 0 {
            rest = tail;
            continue;
        }
        let (masked, did) = mask_url_rest(&tail[..end]);
        changed |= did;
        out.push_str(&masked);
        rest = &tail[end..];
    }
    out.push_str(rest);
    if changed {
        Cow::Owned(out)
    } else {
        Cow::Borrowed(s)
    }
}

/// Masks the part of a URL after `scheme://`: its user info, and the
/// values of secret query parameters.
fn mask_url_rest(rest: &str) -> (String, bool) {
    let mut changed = false;
    let auth_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(auth_end);
    let mut out = String::with_capacity(rest.len());
    match authority.rfind('@') {
        Some(at) => {
            out.push_str(MASK);
            out.push_str(&authority[at..]);
            changed = true;
        }
        None => out.push_str(authority),
    }
    let Some(q) = path.find('?') else {
        out.push_str(path);
        return (out, changed);
    };
    out.push_str(&path[..=q]);
    let query = &path[q + 1..];
    let (query, fragment) = match query.find('#') {
        Some(h) => query.split_at(h),
        None => (query, ""),
    };
    let params: Vec<String> = query
        .split('&')
        .map(|p| match p.split_once('=') {
            Some((k, v)) if !v.is_empty() && is_secret_param(k) => {
                changed = true;
                format!("{k}={MASK}")
            }
            _ => p.to_string(),
        })
        .collect();
    out.push_str(&params.join("&"));
    out.push_str(fragment);
    (out, changed)
}

fn is_secret_param(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    SECRET_PARAMS.iter().any(|p| lower.contains(p))
}

/// A writer that masks URLs in what passes through it. tracing's fmt layer
/// writes each event with one `write_all` of the whole line, so a URL is
/// never split between two calls.
pub struct RedactingWriter<W>(pub W);

impl<W: Write> Write for RedactingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match std::str::from_utf8(buf) {
            Ok(s) => self.0.write_all(text(s).as_bytes())?,
            Err(_) => {
                let lossy = String::from_utf8_lossy(buf);
                self.0.write_all(text(&lossy).as_bytes())?
            }
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

/// stderr through [`RedactingWriter`], as a tracing writer.
pub fn stderr() -> RedactingWriter<std::io::Stderr> {
    RedactingWriter(std::io::stderr())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_info_is_masked_in_any_scheme() {
        assert_eq!(
            text("fetching https://user:pass@example.com/a.run failed"),
            "fetching https://***@example.com/a.run failed"
        );
        assert_eq!(
            text("refusing s3://AKIAKEY:s3cr3t@bucket/prefix"),
            "refusing s3://***@bucket/prefix"
        );
        assert_eq!(text("http://tok@h:8080"), "http://***@h:8080");
        // JSON: the URL ends at the closing quote.
        assert_eq!(
            text(r#"{"url":"https://a:b@h/x","n":1}"#),
            r#"{"url":"https://***@h/x","n":1}"#
        );
        // An @ after the host is part of the path, not user info.
        assert_eq!(text("https://h/a@b"), "https://h/a@b");
    }

    #[test]
    fn secret_query_values_are_masked_others_kept() {
        assert_eq!(
            text("https://h/p.run?X-Amz-Credential=AK%2F1&X-Amz-Signature=abc&v=2#frag"),
            "https://h/p.run?X-Amz-Credential=***&X-Amz-Signature=***&v=2#frag"
        );
        assert_eq!(
            text("see https://h/x?file=a.run&token=t0k (retrying)"),
            "see https://h/x?file=a.run&token=*** (retrying)"
        );
    }

    #[test]
    fn text_without_credentials_is_borrowed() {
        let s = "https://download.nvidia.com/a.run and file:///tmp/x, ://odd";
        assert!(matches!(text(s), Cow::Borrowed(_)));
        assert!(matches!(text("no url here"), Cow::Borrowed(_)));
    }

    #[test]
    fn every_url_in_a_line_is_masked() {
        assert_eq!(
            text("a https://u:p@x/1 then http://v:q@y/2?key=k"),
            "a https://***@x/1 then http://***@y/2?key=***"
        );
    }

    #[test]
    fn the_writer_masks_what_it_passes() {
        let mut w = RedactingWriter(Vec::new());
        w.write_all(b"ERROR https://u:p@h/x\n").unwrap();
        assert_eq!(String::from_utf8(w.0).unwrap(), "ERROR https://***@h/x\n");
    }
}
