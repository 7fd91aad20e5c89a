//! Text cut to what the API server takes: an Event's note, a condition's or a record's message.
//! Shared by the controller and the agent, so both cut the same way.

/// Cuts `text` to at most `max_bytes` bytes, on a character boundary.
#[must_use]
pub fn truncate(text: &str, max_bytes: usize) -> String {
    if text.len() <= max_bytes {
        return text.to_owned();
    }
    let mut end = max_bytes;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_text_is_cut_on_a_character_boundary() {
        assert_eq!(truncate("héllo", 2), "h");
        assert_eq!(truncate("héllo", 3), "hé");
        assert_eq!(truncate("short", 100), "short");
        assert_eq!(truncate("short", 5), "short");
    }
}
