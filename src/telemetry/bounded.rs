//! Log lines of bounded size.
//!
//! Some log lines carry text the operator does not choose: kube-client, on a response it
//! cannot decode, logs the whole response body at WARN (`"{body}, {error}"`), and an
//! apiserver or a proxy in the way can send megabytes. Every log line goes through
//! [`BoundedStderr`]: a line within [`MAX_LINE`] bytes is written as it is; a longer JSON line
//! has each string value cut to [`MAX_VALUE`] bytes (so it stays one valid JSON object), and
//! anything still too long, or not JSON, is cut to [`MAX_LINE`] bytes. A cut says how much it
//! dropped.

use std::io::{self, Write};

use tracing_subscriber::fmt::MakeWriter;

/// The longest line written whole.
pub const MAX_LINE: usize = 16 * 1024;
/// The longest string value kept in an over-long JSON line.
pub const MAX_VALUE: usize = 2 * 1024;

/// Makes one [`LineWriter`] per log event, writing to stderr.
#[derive(Debug, Clone, Copy, Default)]
pub struct BoundedStderr;

impl<'a> MakeWriter<'a> for BoundedStderr {
    type Writer = LineWriter<io::Stderr>;

    fn make_writer(&'a self) -> Self::Writer {
        LineWriter::new(io::stderr())
    }
}

/// Collects one event's bytes and writes them, bounded, when dropped (the formatter writes
/// one event per writer).
#[derive(Debug)]
pub struct LineWriter<W: Write> {
    out: W,
    line: Vec<u8>,
}

impl<W: Write> LineWriter<W> {
    /// A writer of one bounded line to `out`.
    pub fn new(out: W) -> Self {
        Self {
            out,
            line: Vec::new(),
        }
    }
}

impl<W: Write> Write for LineWriter<W> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.line.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<W: Write> Drop for LineWriter<W> {
    fn drop(&mut self) {
        let line = std::mem::take(&mut self.line);
        // Nowhere to report a failed write to stderr.
        let _ = self.out.write_all(&bounded(line));
        let _ = self.out.flush();
    }
}

/// `line` (one log line with its newline) within [`MAX_LINE`] bytes plus the cut notes.
pub fn bounded(line: Vec<u8>) -> Vec<u8> {
    if line.len() <= MAX_LINE {
        return line;
    }
    let total = line.len();
    if let Ok(mut value) = serde_json::from_slice::<serde_json::Value>(&line) {
        cut_strings(&mut value);
        if let Ok(mut json) = serde_json::to_vec(&value)
            && json.len() <= MAX_LINE
        {
            json.push(b'\n');
            return json;
        }
    }
    let text = String::from_utf8_lossy(&line);
    let head = head_of(text.trim_end_matches('\n'), MAX_LINE);
    format!("{head} ... [log line cut: {total} bytes]\n").into_bytes()
}

/// Cuts every string in `value` to [`MAX_VALUE`] bytes.
fn cut_strings(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::String(text) if text.len() > MAX_VALUE => {
            let cut = format!(
                "{} ... [cut: {} bytes]",
                head_of(text, MAX_VALUE),
                text.len()
            );
            *text = cut;
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(cut_strings),
        serde_json::Value::Object(fields) => fields.values_mut().for_each(cut_strings),
        _ => {}
    }
}

/// The longest head of `text` of at most `max` bytes ending on a character boundary.
fn head_of(text: &str, max: usize) -> &str {
    let mut end = max.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_line(line: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        {
            let mut writer = LineWriter::new(&mut out);
            // The formatter may write in pieces.
            for piece in line.chunks(1000) {
                writer.write_all(piece).expect("a Vec takes everything");
            }
        }
        out
    }

    #[test]
    fn a_short_line_is_written_as_it_is() {
        let line = b"{\"level\":\"INFO\",\"message\":\"hello\"}\n";
        assert_eq!(write_line(line), line);
    }

    #[test]
    fn a_response_body_logged_whole_is_cut_and_the_line_stays_json() {
        // What kube-client logs on a body it cannot decode: the body, then the error.
        let body = "x".repeat(5 << 20);
        let line = serde_json::json!({
            "level": "WARN",
            "message": format!("{body}, Error(\"expected value\", line: 1, column: 1)"),
            "target": "kube_client::client",
        });
        let mut line = serde_json::to_vec(&line).expect("json");
        line.push(b'\n');
        let out = write_line(&line);
        assert!(out.len() <= MAX_LINE + 100, "{}", out.len());
        assert!(out.ends_with(b"\n"));
        let parsed: serde_json::Value = serde_json::from_slice(&out).expect("still JSON");
        assert_eq!(parsed["target"], "kube_client::client");
        let message = parsed["message"].as_str().expect("a message");
        assert!(
            message.contains("[cut: 5242"),
            "{}",
            &message[message.len() - 60..]
        );
    }

    #[test]
    fn a_long_text_line_is_cut_on_a_character_boundary() {
        let line = format!("{}\n", "é".repeat(MAX_LINE));
        let out = String::from_utf8(write_line(line.as_bytes())).expect("valid UTF-8");
        assert!(out.len() <= MAX_LINE + 64, "{}", out.len());
        assert!(out.ends_with(&format!("[log line cut: {} bytes]\n", line.len())));
    }

    #[test]
    fn many_long_fields_that_stay_too_long_are_cut_as_text() {
        let fields: serde_json::Map<String, serde_json::Value> = (0..64)
            .map(|i| (format!("f{i}"), serde_json::Value::from("y".repeat(4096))))
            .collect();
        let mut line = serde_json::to_vec(&fields).expect("json");
        line.push(b'\n');
        let out = write_line(&line);
        assert!(out.len() <= MAX_LINE + 64, "{}", out.len());
    }
}
