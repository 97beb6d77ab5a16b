//! The W3C `traceparent` value a job carries (docs/traces.md): checked once where it enters
//! (the API header, an enqueue option), so everything downstream — the store, the exporter,
//! outgoing HTTP calls — can pass it on as it is. A leaf: no OpenTelemetry types, so a build
//! without the `otel` feature still stores and forwards the caller's context.

/// The longest `traceparent` accepted. Version 00 is 55 bytes; later versions may append
/// fields, which are kept but bounded.
pub const MAX_TRACEPARENT_BYTES: usize = 256;

/// Checks a `traceparent`: `VV-<32 hex trace id>-<16 hex span id>-<2 hex flags>` in lowercase
/// hex, version not `ff`, ids not all zeros; version 00 has exactly these four fields.
pub fn validate(tp: &str) -> Result<(), String> {
    let bad = |why: &str| {
        Err(format!(
            "traceparent must be a W3C trace context (00-<32 hex>-<16 hex>-<2 hex>): {why}"
        ))
    };
    if tp.len() > MAX_TRACEPARENT_BYTES {
        return bad("too long");
    }
    let hex = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    let mut parts = tp.split('-');
    let (Some(version), Some(trace), Some(span), Some(flags)) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return bad("it needs four fields separated by '-'");
    };
    if !hex(version, 2) || version == "ff" {
        return bad("invalid version");
    }
    if version == "00" && parts.next().is_some() {
        return bad("version 00 has exactly four fields");
    }
    if !hex(trace, 32) || trace.bytes().all(|b| b == b'0') {
        return bad("invalid trace id");
    }
    if !hex(span, 16) || span.bytes().all(|b| b == b'0') {
        return bad("invalid parent id");
    }
    if !hex(flags, 2) {
        return bad("invalid flags");
    }
    Ok(())
}

/// The trace id of a valid `traceparent` (its second field).
pub fn trace_id(tp: &str) -> Option<&str> {
    tp.split('-').nth(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    const OK: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn accepts_a_w3c_traceparent_and_names_its_trace() {
        assert_eq!(validate(OK), Ok(()));
        assert_eq!(trace_id(OK), Some("4bf92f3577b34da6a3ce929d0e0e4736"));
        // A later version may carry more fields.
        assert!(validate("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x").is_ok());
    }

    #[test]
    fn refuses_what_is_not_one() {
        for bad in [
            "",
            "garbage",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
        ] {
            let e = validate(bad).unwrap_err();
            assert!(e.starts_with("traceparent must be"), "{bad}: {e}");
        }
        assert!(validate(&format!("01-{}", "a".repeat(300))).is_err());
    }
}
