//! Output formats shared by the CLI subcommands: JSON and YAML for machines, tables for people.
//! Pure (no `clap`): `cli` makes [`Format`] a flag value.

use std::borrow::Cow;

use serde::Serialize;

/// How a subcommand prints its result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    /// Aligned columns for people.
    #[default]
    Table,
    /// Pretty-printed JSON.
    Json,
    /// YAML.
    Yaml,
}

/// Serialises a value as pretty JSON followed by a newline.
pub fn to_json<T: Serialize>(value: &T) -> Result<String, serde_json::Error> {
    let mut text = serde_json::to_string_pretty(value)?;
    text.push('\n');
    Ok(text)
}

/// Serialises a value as YAML.
pub fn to_yaml<T: Serialize>(value: &T) -> Result<String, serde_saphyr::ser::Error> {
    serde_saphyr::to_string(value)
}

/// A simple left-aligned text table.
#[derive(Debug, Clone, Default)]
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with the given column headings.
    pub fn new<I: IntoIterator<Item = S>, S: Into<String>>(header: I) -> Self {
        Self {
            header: header.into_iter().map(Into::into).collect(),
            rows: Vec::new(),
        }
    }

    /// Appends a row; missing cells print empty, extra cells are ignored.
    pub fn row<I: IntoIterator<Item = S>, S: Into<String>>(&mut self, cells: I) {
        self.rows.push(cells.into_iter().map(Into::into).collect());
    }

    /// True when no rows were added.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Renders with two spaces between columns and no trailing spaces. A cell longer than
    /// [`MAX_CELL_CHARS`] is cut there and ends in `…`, so one huge value (a hostile model
    /// name in a report) cannot widen every row of the table to its size.
    pub fn render(&self) -> String {
        let columns = self.header.len();
        let mut widths: Vec<usize> = vec![0; columns];
        for row in std::iter::once(&self.header).chain(&self.rows) {
            for (i, width) in widths.iter_mut().enumerate() {
                *width = (*width).max(cell(row, i).chars().count());
            }
        }
        let mut out = String::new();
        for row in std::iter::once(&self.header).chain(&self.rows) {
            let mut line = String::new();
            for (i, width) in widths.iter().enumerate() {
                // Padded by hand: `{:<width$}` panics for widths over 65,535.
                let text = cell(row, i);
                line.push_str(&text);
                let pad = width.saturating_sub(text.chars().count()) + 2;
                line.extend(std::iter::repeat_n(' ', pad));
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// Longest table cell, in characters, before it is cut.
pub const MAX_CELL_CHARS: usize = 200;

/// Cell `i` of a row (empty when the row is short), cut to [`MAX_CELL_CHARS`] characters with
/// a trailing `…` when longer.
fn cell(row: &[String], i: usize) -> Cow<'_, str> {
    let text = row.get(i).map_or("", String::as_str);
    match text.char_indices().nth(MAX_CELL_CHARS) {
        None => Cow::Borrowed(text),
        Some(_) => {
            let kept: String = text.chars().take(MAX_CELL_CHARS - 1).collect();
            Cow::Owned(kept + "…")
        }
    }
}

/// Formats bytes in binary units with one decimal (`80.0 GiB`).
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_aligns_columns() {
        let mut table = Table::new(["ID", "MODEL"]);
        table.row(["0000:18:00.0", "H100"]);
        table.row(["x", "A much longer name"]);
        assert_eq!(
            table.render(),
            "ID            MODEL\n0000:18:00.0  H100\nx             A much longer name\n"
        );
    }

    #[test]
    fn a_cell_longer_than_u16_max_is_cut_not_a_panic() {
        // `{:<width$}` panicked for widths over 65,535.
        let long = "x".repeat(70_000);
        let mut table = Table::new(["ID", "MODEL"]);
        table.row(["gpu0", long.as_str()]);
        table.row(["gpu1", "H100"]);
        let text = table.render();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3);
        let cut = format!("gpu0  {}…", "x".repeat(MAX_CELL_CHARS - 1));
        assert_eq!(lines[1], cut);
        assert_eq!(lines[2], "gpu1  H100");
        // A header that long is cut the same way, and a multi-byte cell is cut on a character.
        let mut table = Table::new([long.as_str(), "B"]);
        table.row(["é".repeat(70_000), "b".to_string()]);
        for line in table.render().lines() {
            assert!(line.chars().count() <= MAX_CELL_CHARS + 3, "{}", line.len());
        }
    }

    #[test]
    fn bytes_are_human() {
        assert_eq!(human_bytes(80 * (1 << 30)), "80.0 GiB");
        assert_eq!(human_bytes(512), "512 B");
    }
}
