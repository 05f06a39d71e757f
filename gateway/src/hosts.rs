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
