//! The allowed-hosts check (DNS rebinding protection): which `Host` headers the gateway
//! answers for. rmcp checks MCP requests itself; the direct MCP path and the protected
//! resource metadata check with this, the same way.

use http::header::HOST;

/// `host[:port]` without IPv6 brackets, as rmcp compares them (hosts without regard to case).
fn authority(value: &str) -> Option<(&str, Option<u16>)> {
    let value = value.trim();
    let parsed = http::uri::Authority::try_from(value).ok()?;
    // The parsed host, borrowed from `value`: it starts after any user info.
    let start = value.rfind('@').map_or(0, |at| at + 1);
    let host = value.get(start..start + parsed.host().len())?;
    Some((host.trim_matches(['[', ']']), parsed.port_u16()))
}

/// The request's `Origin` is the gateway's own loopback origin: `http://` or `https://`
/// followed by the very `Host` the request was sent to, a loopback name (`localhost`,
/// `127.0.0.1`, `[::1]`, any port). Only the gateway serves that origin, and it serves no
/// pages, so such a request is not cross-origin; a DNS-rebinding page cannot send it either,
/// as its `Host` is the attacker's name. It needs no `--allowed-origins` entry.
pub fn is_own_loopback_origin(headers: &http::HeaderMap) -> bool {
    let (Some(origin), Some(host)) = (headers.get(http::header::ORIGIN), headers.get(HOST)) else {
        return false;
    };
    let (Ok(origin), Ok(host)) = (origin.to_str(), host.to_str()) else { return false };
    let Some(origin_authority) = origin.strip_prefix("http://").or_else(|| origin.strip_prefix("https://")) else {
        return false;
    };
    origin_authority.eq_ignore_ascii_case(host)
        && authority(host).is_some_and(|(name, _)| {
            crate::state::loopback_hosts().iter().any(|loopback| loopback.eq_ignore_ascii_case(name))
        })
}

/// The allowed-hosts setting, parsed once: `host[:port]` entries compared as rmcp compares
/// them. An entry that is no authority (such as a bare `::1`) is taken as a host name. An
/// empty setting (`None` here, the default) allows every host.
#[derive(Clone, Debug, Default)]
pub struct AllowedHosts(Option<Vec<(String, Option<u16>)>>);

impl AllowedHosts {
    /// The setting from its entries (empty: every host).
    pub fn new(allowed: &[String]) -> Self {
        let parse = |allowed: &String| {
            let allowed = allowed.trim();
            (!allowed.is_empty()).then(|| {
                let (host, port) = authority(allowed).unwrap_or_else(|| (allowed.trim_matches(['[', ']']), None));
                (host.to_ascii_lowercase(), port)
            })
        };
        AllowedHosts((!allowed.is_empty()).then(|| allowed.iter().filter_map(parse).collect()))
    }

    /// The request's `Host` (or, without one, its HTTP/2 authority) is allowed: an allowed
    /// entry without a port matches any port. A request naming no host is refused.
    pub fn allows(&self, headers: &http::HeaderMap, uri: &http::Uri) -> bool {
        let host = match headers.get(HOST) {
            Some(value) => value.to_str().ok().and_then(authority),
            None => uri.authority().and_then(|a| authority(a.as_str())),
        };
        let Some((host, port)) = host else { return false };
        let Some(allowed_hosts) = &self.0 else { return true };
        allowed_hosts.iter().any(|(allowed, allowed_port)| {
            allowed.eq_ignore_ascii_case(host) && allowed_port.is_none_or(|p| port == Some(p))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(origin: &str, host: &str) -> http::HeaderMap {
        let mut headers = http::HeaderMap::new();
        headers.insert(http::header::ORIGIN, origin.parse().unwrap());
        headers.insert(HOST, host.parse().unwrap());
        headers
    }

    #[test]
    fn only_the_loopback_authority_the_request_was_sent_to_is_its_own_origin() {
        for (origin, host) in [
            ("http://127.0.0.1:8080", "127.0.0.1:8080"),
            ("https://LOCALHOST:8443", "localhost:8443"),
            ("http://[::1]:9000", "[::1]:9000"),
            ("http://localhost", "localhost"),
        ] {
            assert!(is_own_loopback_origin(&headers(origin, host)), "{origin} sent to {host}");
        }
        for (origin, host) in [
            ("http://localhost:6274", "localhost:8080"),       // another local page
            ("http://localhost:8080", "127.0.0.1:8080"),       // another name
            ("http://evil.example:8080", "evil.example:8080"), // DNS rebinding
            ("http://gateway.example", "gateway.example"),     // not loopback: listed or refused
            ("null", "127.0.0.1:8080"),
            ("ftp://127.0.0.1:8080", "127.0.0.1:8080"),
            ("http://127.0.0.1:8080/", "127.0.0.1:8080"),
        ] {
            assert!(!is_own_loopback_origin(&headers(origin, host)), "{origin} sent to {host}");
        }
        let mut no_host = headers("http://127.0.0.1:8080", "127.0.0.1:8080");
        no_host.remove(HOST);
        assert!(!is_own_loopback_origin(&no_host));
    }
}
