//! mergekit's named chat templates (`chat_template: chatml`, …), as mergescope's own templates in
//! `assets/chat_templates/`: written for mergescope, not copied from mergekit, and checked to
//! render every chat of `scripts/mergekit-chat-templates.py` exactly as mergekit 0.1.5's bundled
//! ones do under transformers' renderer (its quirks included: Llama 3's newline after each
//! message, EXAONE's indentation). The script records each template's SHA-256 in
//! `tests/fixtures/chat_templates/verified.json`, which a test holds the shipped text to.

/// Every named template: name and Jinja text.
pub const NAMED: [(&str, &str); 5] = [
    ("alpaca", include_str!("../../../assets/chat_templates/alpaca.jinja")),
    ("chatml", include_str!("../../../assets/chat_templates/chatml.jinja")),
    ("exaone", include_str!("../../../assets/chat_templates/exaone.jinja")),
    ("llama3", include_str!("../../../assets/chat_templates/llama3.jinja")),
    ("mistral", include_str!("../../../assets/chat_templates/mistral.jinja")),
];

/// The name and text of the named template `name`, if there is one.
pub fn named(name: &str) -> Option<(&'static str, &'static str)> {
    NAMED.iter().copied().find(|(n, _)| *n == name)
}

/// The names, comma-separated, for messages.
pub fn names() -> String {
    NAMED.map(|(n, _)| n).join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::{Digest, Sha256};

    /// The shipped templates are the ones `scripts/mergekit-chat-templates.py` rendered against
    /// mergekit's: an edit without running the script again fails here.
    #[test]
    fn named_chat_templates_are_the_verified_ones() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/chat_templates/verified.json"
        );
        let verified: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let hashes = verified["sha256"].as_object().unwrap();
        assert_eq!(hashes.len(), NAMED.len());
        for (name, text) in NAMED {
            let digest: String = Sha256::digest(text.as_bytes())
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            assert_eq!(
                hashes[name].as_str().unwrap(),
                digest,
                "assets/chat_templates/{name}.jinja is not the template scripts/mergekit-chat-templates.py checked; run it"
            );
        }
        assert!(verified["cases_per_template"].as_u64().unwrap() >= 40);
        assert_eq!(named("chatml").unwrap().0, "chatml");
        assert!(named("vicuna").is_none());
    }
}
