//! Container image references (`[host[:port]/]path[:tag][@digest]`), checked with the grammar
//! of the distribution project so a typo fails on the McpTool, not in a pod that never starts.

/// Checks `s`; the error says what is wrong.
pub fn check(s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Err("is empty".into());
    }
    let (rest, digest) = match s.split_once('@') {
        Some((r, d)) => (r, Some(d)),
        None => (s, None),
    };
    if let Some(d) = digest {
        check_digest(d)?;
    }
    let (name, tag) = match rest.rfind(':') {
        Some(i) if !rest[i + 1..].contains('/') => (&rest[..i], Some(&rest[i + 1..])),
        _ => (rest, None),
    };
    if let Some(t) = tag {
        check_tag(t)?;
    }
    if name.is_empty() {
        return Err("has no repository name".into());
    }
    if name.len() > 255 {
        return Err("repository name is longer than 255 characters".into());
    }
    let mut parts: Vec<&str> = name.split('/').collect();
    if parts.len() > 1 {
        let first = parts[0];
        if first.contains(['.', ':']) || first == "localhost" || first.chars().any(|c| c.is_ascii_uppercase()) {
            check_host(first)?;
            parts.remove(0);
        }
    }
    for p in parts {
        check_path_component(p)?;
    }
    Ok(())
}

fn check_digest(d: &str) -> Result<(), String> {
    let (algo, hex) = d.split_once(':').ok_or_else(|| format!("digest {d:?} must be <algorithm>:<hex>"))?;
    let algo_ok = !algo.is_empty()
        && algo.split(['+', '.', '-', '_']).all(|c| {
            c.starts_with(|ch: char| ch.is_ascii_alphabetic()) && c.chars().all(|ch| ch.is_ascii_alphanumeric())
        });
    if !algo_ok {
        return Err(format!("digest algorithm {algo:?} is not valid"));
    }
    if hex.len() < 32 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(format!("digest {d:?} must end in at least 32 hex characters"));
    }
    Ok(())
}

fn check_tag(t: &str) -> Result<(), String> {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let ok =
        !t.is_empty() && t.len() <= 128 && t.starts_with(word) && t.chars().all(|c| word(c) || c == '.' || c == '-');
    if ok { Ok(()) } else { Err(format!("tag {t:?} is not valid (letters, digits, '_', '.', '-'; at most 128)")) }
}

fn check_host(h: &str) -> Result<(), String> {
    let (host, port) = if let Some(rest) = h.strip_prefix('[') {
        let (v6, after) = rest.split_once(']').ok_or_else(|| format!("registry host {h:?} is not valid"))?;
        if v6.is_empty() || !v6.chars().all(|c| c.is_ascii_hexdigit() || c == ':') {
            return Err(format!("registry host {h:?} is not valid"));
        }
        (None, after.strip_prefix(':'))
    } else {
        match h.split_once(':') {
            Some((host, port)) => (Some(host), Some(port)),
            None => (Some(h), None),
        }
    };
    if let Some(port) = port
        && (port.is_empty() || !port.chars().all(|c| c.is_ascii_digit()))
    {
        return Err(format!("registry port in {h:?} is not a number"));
    }
    if let Some(host) = host {
        let ok = !host.is_empty()
            && host.split('.').all(|c| {
                !c.is_empty()
                    && !c.starts_with('-')
                    && !c.ends_with('-')
                    && c.chars().all(|ch| ch.is_ascii_alphanumeric() || ch == '-')
            });
        if !ok {
            return Err(format!("registry host {h:?} is not valid"));
        }
    }
    Ok(())
}

fn check_path_component(p: &str) -> Result<(), String> {
    let err = || {
        format!(
            "repository path component {p:?} is not valid (lowercase letters and digits, separated by '.', '_', '__' or '-')"
        )
    };
    if p.is_empty() || !p.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit()) {
        return Err(err());
    }
    if !p.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit()) {
        return Err(err());
    }
    let bytes = p.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            i += 1;
            continue;
        }
        // A separator run: '.', '_', '__' or any number of '-'.
        let start = i;
        while i < bytes.len() && matches!(bytes[i], b'.' | b'_' | b'-') {
            i += 1;
        }
        let sep = &p[start..i];
        let ok = sep == "." || sep == "_" || sep == "__" || sep.chars().all(|c| c == '-');
        if !ok {
            return Err(err());
        }
        if i < bytes.len() && !(bytes[i].is_ascii_lowercase() || bytes[i].is_ascii_digit()) {
            return Err(err());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check;

    #[test]
    fn common_references_are_accepted() {
        for ok in [
            "python",
            "python:3.12-slim",
            "library/python:3.12",
            "ghcr.io/toolyard/pricing:0.1.0",
            "localhost:5000/tool",
            "registry.example.com:443/a/b/c:v1.2.3_x",
            "[::1]:5000/tool:1",
            "quay.io/org/my__tool-name.x:latest",
            "ghcr.io/o/r@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "ghcr.io/o/r:1@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "Registry.Example.com/tool",
        ] {
            assert_eq!(check(ok), Ok(()), "{ok}");
        }
    }

    #[test]
    fn malformed_references_are_refused_with_a_reason() {
        for (bad, why) in [
            ("", "empty"),
            ("Python:3", "path component"),
            ("ghcr.io/Toolyard/x", "path component"),
            ("tool:", "tag"),
            ("tool:-x", "tag"),
            ("tool@sha256:abc", "32 hex"),
            ("tool@:0123456789abcdef0123456789abcdef", "algorithm"),
            ("registry:port/tool", "port"),
            ("a//b", "path component"),
            ("a/-b", "path component"),
            ("a/b_", "path component"),
            ("a/b___c", "path component"),
            ("bad_host.example/x", "host"),
        ] {
            let err = check(bad).expect_err(bad);
            assert!(err.contains(why), "{bad}: {err}");
        }
    }
}
