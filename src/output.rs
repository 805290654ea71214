//! Output formats shared by the CLI subcommands: JSON and YAML for machines, tables for people.

use std::fmt::Write as _;

use serde::Serialize;

/// How a subcommand prints its result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
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

    /// Renders with two spaces between columns and no trailing spaces.
    pub fn render(&self) -> String {
        let columns = self.header.len();
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (width, cell) in widths.iter_mut().zip(row) {
                *width = (*width).max(cell.chars().count());
            }
        }
        let mut out = String::new();
        for row in std::iter::once(&self.header).chain(&self.rows) {
            let mut line = String::new();
            for (i, width) in widths.iter().enumerate().take(columns) {
                let cell = row.get(i).map_or("", String::as_str);
                let _ = write!(line, "{cell:<width$}  ");
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
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
    fn bytes_are_human() {
        assert_eq!(human_bytes(80 * (1 << 30)), "80.0 GiB");
        assert_eq!(human_bytes(512), "512 B");
    }
}
