//! The HTTP client every download uses, and how its errors read.

use super::policy::FetchPolicy;
use crate::error::{Error, Failure, Result};

/// `--ca-bundle`: a system's whole bundle is a few hundred KiB.
const CA_BUNDLE: crate::named_file::Named = crate::named_file::Named {
    what: "the CA bundle (--ca-bundle)",
    max: 4 << 20,
    reason: Failure::InvalidArgument,
    hint: "--ca-bundle takes a PEM file of CA certificates",
};

/// Redirects followed per request.
const MAX_REDIRECTS: usize = 5;

/// The HTTP client (reqwest, blocking): TLS via rustls with ring (the
/// bundled web roots, plus `ca_bundle`), one proxy from the environment
/// (`proxy_from_env`), at most 5 redirects and never from HTTPS to plain
/// HTTP, HTTPS only unless plain HTTP is allowed, no content decoding (the
/// bytes hashed are the bytes served), status codes handled by us.
///
/// `timeouts.read` bounds the wait for the response head (counted from the
/// start of the request, connecting included) and every single read of the
/// body; `timeouts.connect` bounds connecting alone.
pub fn agent(policy: &FetchPolicy) -> Result<reqwest::blocking::Client> {
    let mut roots = crate::tls::web_roots();
    if let Some(path) = &policy.ca_bundle {
        let pem = CA_BUNDLE.read(path)?;
        let certs = crate::tls::pem_certificates(&pem).map_err(|e| {
            Error::new(
                Failure::InvalidArgument,
                format!("CA bundle {} is not valid PEM: {e}", path.display()),
            )
        })?;
        if certs.is_empty() {
            return Err(Error::new(
                Failure::InvalidArgument,
                format!("CA bundle {} holds no PEM certificate", path.display()),
            ));
        }
        let (added, _) = roots.add_parsable_certificates(certs);
        if added == 0 {
            return Err(Error::new(
                Failure::InvalidArgument,
                format!(
                    "CA bundle {} holds no usable CA certificate",
                    path.display()
                ),
            ));
        }
    }
    let tls = crate::tls::client_config(roots)
        .map_err(|e| Error::new(Failure::Internal, format!("configuring TLS: {e}")))?;
    // The environment's proxy is chosen here, not by reqwest (no_proxy
    // first turns its own lookup off).
    let mut builder = reqwest::blocking::Client::builder()
        .no_proxy()
        .tls_backend_preconfigured(tls)
        .https_only(!policy.allow_http)
        .redirect(redirect_policy())
        .connect_timeout(policy.timeouts.connect)
        .timeout(policy.timeouts.read)
        .http1_only()
        .no_gzip()
        .no_brotli()
        .no_zstd()
        .no_deflate()
        .user_agent(format!(
            "gpu-driver-installer/{}",
            env!("CARGO_PKG_VERSION")
        ));
    if let Some(proxy) = proxy_from_env() {
        builder = builder.proxy(proxy);
    }
    builder.build().map_err(|e| {
        Error::new(
            Failure::Internal,
            format!("building the HTTP client: {}", describe(&e)),
        )
    })
}

/// The variables a proxy is taken from, in order (`NO_PROXY` and
/// `no_proxy` list the hosts that bypass it).
pub const PROXY_VARS: [&str; 6] = [
    "ALL_PROXY",
    "all_proxy",
    "HTTPS_PROXY",
    "https_proxy",
    "HTTP_PROXY",
    "http_proxy",
];

/// The proxy for every URL: the first usable of `ALL_PROXY`, `HTTPS_PROXY`
/// and `HTTP_PROXY` (upper or lower case), bypassed for the hosts in
/// `NO_PROXY`. HTTPS goes through it with CONNECT; plain HTTP (only with
/// `--allow-http`) is forwarded by it.
fn proxy_from_env() -> Option<reqwest::Proxy> {
    for var in PROXY_VARS {
        let Ok(value) = std::env::var(var) else {
            continue;
        };
        if value.trim().is_empty() {
            continue;
        }
        match reqwest::Proxy::all(value.trim()) {
            Ok(p) => return Some(p.no_proxy(reqwest::NoProxy::from_env())),
            // The value may hold credentials: name the variable only.
            Err(_) => tracing::warn!("{var} is not a usable proxy URL; ignoring it"),
        }
    }
    None
}

/// At most [`MAX_REDIRECTS`] redirects, and only to HTTPS: `--allow-http`
/// permits the plain-HTTP URLs it was given, never one a server (or a
/// network in between) names, so a redirect can never lower the scheme.
fn redirect_policy() -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(|attempt| {
        if attempt.previous().len() > MAX_REDIRECTS {
            let msg = format!("more than {MAX_REDIRECTS} redirects");
            attempt.error(msg)
        } else if attempt.url().scheme() != "https" {
            let from = attempt.previous().last().map(redacted).unwrap_or_default();
            let msg = format!(
                "refusing a redirect from {from} to {}: redirects are followed to HTTPS only",
                redacted(attempt.url())
            );
            attempt.error(msg)
        } else {
            attempt.follow()
        }
    })
}

/// A URL as it may be shown: without user info or query (either may hold a
/// credential, e.g. a signed mirror URL).
fn redacted(url: &reqwest::Url) -> String {
    let mut u = url.clone();
    let _ = u.set_username("");
    let _ = u.set_password(None);
    u.set_query(None);
    u.to_string()
}

/// An error with its causes. reqwest's own message is terse ("error sending
/// request"); the causes say what happened (refused, timed out, which
/// certificate problem).
pub(crate) fn describe(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let m = c.to_string();
        if !text.contains(&m) {
            text.push_str(": ");
            text.push_str(&m);
        }
        cause = c.source();
    }
    text
}

/// A request's error, described without its URL (the caller names it).
pub(crate) fn describe_http_error(e: reqwest::Error) -> String {
    describe(&e.without_url())
}

/// A server certificate the trusted roots reject (unknown issuer, wrong
/// name, expired): configuration, not weather, so a retry only delays the
/// answer. rustls reports it as its own error, somewhere in the chain of
/// causes, usually wrapped in the handshake's io::Error (whose `source`
/// skips the wrapped error itself, hence the look inside).
pub(super) fn is_certificate_error(e: &(dyn std::error::Error + 'static)) -> bool {
    let bad = |r: &rustls::Error| {
        matches!(
            r,
            rustls::Error::InvalidCertificate(_) | rustls::Error::NoCertificatesPresented
        )
    };
    let mut cur = Some(e);
    while let Some(err) = cur {
        if err.downcast_ref::<rustls::Error>().is_some_and(bad) {
            return true;
        }
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            if io
                .get_ref()
                .is_some_and(|inner| is_certificate_error(inner))
            {
                return true;
            }
        }
        cur = err.source();
    }
    false
}

/// HTTP statuses worth retrying: timeouts, throttling, server errors.
pub(crate) fn retryable_status(code: u16) -> bool {
    code == 408 || code == 429 || (500..=599).contains(&code)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--ca-bundle /dev/zero` (or a FIFO, or a secret) neither hangs, nor
    /// fills memory, nor shows up in a message.
    #[test]
    fn the_ca_bundle_is_read_bounded() {
        crate::named_file::hostile::assert_refused(CA_BUNDLE.max, |p| {
            let policy = FetchPolicy {
                cache_dir: std::env::temp_dir(),
                offline: false,
                allow_http: false,
                retry: super::super::RetryPolicy::default(),
                timeouts: super::super::Timeouts::default(),
                ca_bundle: Some(p.to_path_buf()),
                progress_bar: false,
            };
            agent(&policy).map(|_| ())
        });
    }

    #[test]
    fn retryable_statuses() {
        for c in [408, 429, 500, 502, 503, 504] {
            assert!(retryable_status(c), "{c}");
        }
        for c in [200, 301, 400, 401, 403, 404, 410] {
            assert!(!retryable_status(c), "{c}");
        }
    }
}
