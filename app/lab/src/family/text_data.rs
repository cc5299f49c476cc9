//! Text-classification data as users keep it: JSONL (one object a line) or CSV with a header,
//! each example a `text`, an optional `text_pair` (sentence-pair tasks such as NLI) and a
//! `label` (a class index, or a class name when the task lists its class names).

use mergescope_engine::error::{EngineError, Result};
use std::path::Path;

/// One labelled example.
#[derive(Clone, Debug, PartialEq)]
pub struct TextExample {
    /// The text (the first sentence of a pair).
    pub text: String,
    /// The second sentence of a sentence-pair task.
    pub pair: Option<String>,
    /// The class index.
    pub label: usize,
}

/// Reads a task's examples from `path` (`.jsonl`/`.json` lines or `.csv`). `classes` names the
/// classes when labels are written as names; without it labels must be indices. Errors name
/// the file, the line and the fix.
pub fn read_text_task(path: &Path, classes: Option<&[String]>) -> Result<Vec<TextExample>> {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase)
        .unwrap_or_default();
    let examples = match ext.as_str() {
        "jsonl" | "json" | "ndjson" => read_jsonl(path, classes)?,
        "csv" => read_csv(path, classes)?,
        _ => {
            return Err(EngineError::evaluator(format!(
                "'{}': unknown data format; write the task's examples as .jsonl (one {{\"text\": ..., \"label\": ...}} a line) or .csv (header text,label)",
                path.display()
            )));
        }
    };
    if examples.is_empty() {
        return Err(EngineError::evaluator(format!(
            "'{}' holds no examples; a task needs at least one",
            path.display()
        )));
    }
    Ok(examples)
}

/// The class index of a label written as `raw` (a number, or a name from `classes`).
fn label_index(raw: &str, classes: Option<&[String]>) -> std::result::Result<usize, String> {
    if let Some(names) = classes
        && let Some(i) = names.iter().position(|n| n == raw)
    {
        return Ok(i);
    }
    match raw.trim().parse::<usize>() {
        Ok(i) => Ok(i),
        Err(_) => Err(match classes {
            Some(names) => format!("label '{raw}' is not one of the task's labels ({})", names.join(", ")),
            None => format!(
                "label '{raw}' is not a class index; write labels as 0, 1, ... or list the class names as labels = [...] in the task"
            ),
        }),
    }
}

fn read_jsonl(path: &Path, classes: Option<&[String]>) -> Result<Vec<TextExample>> {
    let text = std::fs::read_to_string(path).map_err(|e| EngineError::io("cannot read", path, e))?;
    let at = |line: usize, what: String| EngineError::evaluator(format!("'{}', line {line}: {what}", path.display()));
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(line).map_err(|e| at(i + 1, format!("not JSON ({e})")))?;
        let field = |k: &str| v.get(k).and_then(|x| x.as_str()).map(str::to_owned);
        let text = field("text").ok_or_else(|| at(i + 1, "no string \"text\"".into()))?;
        let label = match v.get("label") {
            Some(serde_json::Value::Number(n)) => n
                .as_u64()
                .map(|n| n as usize)
                .ok_or_else(|| at(i + 1, format!("label {n} is not a class index (0, 1, ...)")))?,
            Some(serde_json::Value::String(s)) => label_index(s, classes).map_err(|m| at(i + 1, m))?,
            _ => return Err(at(i + 1, "no \"label\" (a class index or a class name)".into())),
        };
        out.push(TextExample {
            text,
            pair: field("text_pair"),
            label,
        });
    }
    Ok(out)
}

fn read_csv(path: &Path, classes: Option<&[String]>) -> Result<Vec<TextExample>> {
    let bad = |what: String| EngineError::evaluator(format!("'{}': {what}", path.display()));
    let mut reader = csv::Reader::from_path(path).map_err(|e| bad(format!("cannot read CSV ({e})")))?;
    let header = reader
        .headers()
        .map_err(|e| bad(format!("cannot read the header ({e})")))?
        .clone();
    let column = |name: &str| header.iter().position(|h| h.trim() == name);
    let (Some(text_col), Some(label_col)) = (column("text"), column("label")) else {
        return Err(bad(format!(
            "the header must name the columns text and label (it has: {})",
            header.iter().collect::<Vec<_>>().join(", ")
        )));
    };
    let pair_col = column("text_pair");
    let mut out = Vec::new();
    for (i, record) in reader.records().enumerate() {
        // Line numbers count the header as line 1.
        let line = i + 2;
        let record = record.map_err(|e| bad(format!("line {line}: {e}")))?;
        let cell = |c: usize| record.get(c).unwrap_or("").to_owned();
        let label = label_index(&cell(label_col), classes).map_err(|m| bad(format!("line {line}: {m}")))?;
        out.push(TextExample {
            text: cell(text_col),
            pair: pair_col.map(cell).filter(|s| !s.is_empty()),
            label,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn jsonl_and_csv_read_the_same_examples() {
        let dir = tempfile::tempdir().unwrap();
        let j = write(
            dir.path(),
            "t.jsonl",
            "{\"text\": \"a, b\", \"label\": 1}\n\n{\"text\": \"c\", \"text_pair\": \"d\", \"label\": \"neg\"}\n",
        );
        let c = write(dir.path(), "t.csv", "label,text,text_pair\n1,\"a, b\",\nneg,c,d\n");
        let names = ["neg".to_owned(), "pos".to_owned()];
        let a = read_text_task(&j, Some(&names)).unwrap();
        let b = read_text_task(&c, Some(&names)).unwrap();
        assert_eq!(a, b);
        assert_eq!(a[0].text, "a, b");
        assert_eq!(a[0].label, 1);
        assert_eq!(a[1].pair.as_deref(), Some("d"));
        assert_eq!(a[1].label, 0);
    }

    #[test]
    fn bad_data_names_the_file_line_and_fix() {
        let dir = tempfile::tempdir().unwrap();
        let e = read_text_task(
            &write(
                dir.path(),
                "a.jsonl",
                "{\"text\": \"x\", \"label\": 0}\n{\"text\": \"y\"}\n",
            ),
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("a.jsonl") && e.contains("line 2") && e.contains("label"),
            "{e}"
        );
        let e = read_text_task(
            &write(dir.path(), "b.jsonl", "{\"text\": \"x\", \"label\": \"pos\"}\n"),
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("line 1") && e.contains("labels = ["), "{e}");
        let e = read_text_task(&write(dir.path(), "c.csv", "sentence,label\nx,0\n"), None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("c.csv") && e.contains("text and label") && e.contains("sentence"),
            "{e}"
        );
        let e = read_text_task(&write(dir.path(), "d.txt", "x"), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains(".jsonl") && e.contains(".csv"), "{e}");
        let e = read_text_task(&write(dir.path(), "e.jsonl", "\n"), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("no examples"), "{e}");
    }
}
