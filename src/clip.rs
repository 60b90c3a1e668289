//! Error text is bounded: a hostile script or payload chooses how long its error is, and
//! every copy of it (the message, the thread, the `error` event, the store, an answer) would
//! otherwise be that long.

/// `text` cut to at most `max` bytes (at a character boundary), saying how much was cut.
pub fn clip(text: String, max: usize) -> String {
    if text.len() <= max {
        return text;
    }
    let note_room = 40.min(max);
    let mut cut = max - note_room;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}… [{} bytes cut]", &text[..cut], text.len() - cut)
}

#[cfg(test)]
mod tests {
    use super::clip;

    #[test]
    fn long_text_is_cut_at_a_boundary_and_says_how_much() {
        assert_eq!(clip("short".into(), 64), "short");
        let long = "é".repeat(1000);
        let cut = clip(long, 100);
        assert!(cut.len() <= 100, "{}", cut.len());
        assert!(cut.ends_with("bytes cut]"), "{cut}");
        assert!(cut.contains("[1940 bytes cut]"), "{cut}");
    }
}
