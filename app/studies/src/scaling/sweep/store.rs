//! The sweep's results file: one CSV row per (sweep point, task group, method, task), appended
//! a whole cell at a time as cells finish, so a killed sweep loses at most the cell it was on.
//! On resume the file is read back, a torn last line and incomplete cells are dropped, and the
//! finished cells are skipped.

use super::spec::{EXPERT, Hyper};
use mergescope_engine::error::{EngineError, Result};
use std::collections::BTreeSet;
use std::io::Write as _;
use std::path::{Path, PathBuf};

/// The CSV header.
pub const HEADER: &str =
    "lr,batch,steps,data_ratio,optimizer,tasks,group,group_tasks,method,task,accuracy,loss,examples,seconds";

/// One result row.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// The sweep point (`tasks` is 0 on the experts' rows: an expert belongs to no group).
    pub hyper: Hyper,
    /// Task group index (None on the experts' rows).
    pub group: Option<usize>,
    /// The group's tasks, `+`-joined (empty on the experts' rows).
    pub group_tasks: String,
    /// Method name, or [`EXPERT`].
    pub method: String,
    /// Task evaluated.
    pub task: String,
    /// Test accuracy on the task.
    pub accuracy: f64,
    /// Mean cross-entropy on the task.
    pub loss: f64,
    /// Test examples evaluated.
    pub examples: usize,
    /// Seconds the cell took (merge and evaluation), the same on each of its rows.
    pub seconds: f64,
}

/// What identifies a cell: every column before the task.
pub type CellKey = String;

impl Row {
    /// The key of the cell the row belongs to (an expert's cell is its one task).
    pub fn cell(&self) -> CellKey {
        if self.method == EXPERT {
            expert_cell_key(&self.hyper, &self.task)
        } else {
            cell_key(&self.hyper, self.group, &self.method)
        }
    }

    fn to_line(&self) -> String {
        let h = &self.hyper;
        format!(
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{:.3}",
            h.lr,
            h.batch,
            h.steps,
            h.data_ratio,
            field(&h.optimizer),
            h.tasks,
            self.group.map_or(String::new(), |g| g.to_string()),
            field(&self.group_tasks),
            field(&self.method),
            field(&self.task),
            self.accuracy,
            self.loss,
            self.examples,
            self.seconds
        )
    }

    fn parse(line: &str) -> Option<Row> {
        let f = split_fields(line)?;
        if f.len() != 14 {
            return None;
        }
        Some(Row {
            hyper: Hyper {
                lr: f[0].parse().ok()?,
                batch: f[1].parse().ok()?,
                steps: f[2].parse().ok()?,
                data_ratio: f[3].parse().ok()?,
                optimizer: f[4].clone(),
                tasks: f[5].parse().ok()?,
            },
            group: if f[6].is_empty() {
                None
            } else {
                Some(f[6].parse().ok()?)
            },
            group_tasks: f[7].clone(),
            method: f[8].clone(),
            task: f[9].clone(),
            accuracy: f[10].parse().ok()?,
            loss: f[11].parse().ok()?,
            examples: f[12].parse().ok()?,
            seconds: f[13].parse().ok()?,
        })
    }
}

/// The key of the cell of `method` on `group` at `hyper`. Experts' cells ignore N.
pub fn cell_key(hyper: &Hyper, group: Option<usize>, method: &str) -> CellKey {
    let tasks = if method == EXPERT { 0 } else { hyper.tasks };
    format!(
        "{}|{}|{}|{}|{}|{}|{}|{}",
        hyper.lr,
        hyper.batch,
        hyper.steps,
        hyper.data_ratio,
        hyper.optimizer,
        tasks,
        group.map_or(String::new(), |g| g.to_string()),
        method
    )
}

/// The key of the cell of the expert of `task` at `hyper` (one row; N does not matter).
pub fn expert_cell_key(hyper: &Hyper, task: &str) -> CellKey {
    cell_key(hyper, None, EXPERT) + "|" + task
}

fn field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_owned()
    }
}

fn split_fields(line: &str) -> Option<Vec<String>> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' if quoted && chars.peek() == Some(&'"') => {
                cur.push('"');
                chars.next();
            }
            '"' => quoted = !quoted,
            ',' if !quoted => out.push(std::mem::take(&mut cur)),
            c => cur.push(c),
        }
    }
    if quoted {
        return None;
    }
    out.push(cur);
    Some(out)
}

/// The results file of a sweep, open for appending.
pub struct ResultsFile {
    path: PathBuf,
    file: std::fs::File,
}

impl ResultsFile {
    /// Opens `path`, keeping the rows of cells that are complete (`expected(row)` gives the
    /// number of rows a cell has) and dropping the rest (a torn last line, a cell cut short);
    /// creates the file with its header if missing. Returns the file and the kept rows.
    pub fn open(path: &Path, expected: &dyn Fn(&Row) -> Option<usize>) -> Result<(ResultsFile, Vec<Row>)> {
        let mut rows = Vec::new();
        let mut rewrite = !path.exists();
        if path.exists() {
            let text = std::fs::read_to_string(path).map_err(|e| EngineError::io("cannot read", path, e))?;
            let mut lines = text.lines();
            if lines.next() != Some(HEADER) {
                return Err(EngineError::Invalid(format!(
                    "'{}' is not a sweep results file (its header differs); choose another --out folder",
                    path.display()
                )));
            }
            let parsed: Vec<Option<Row>> = lines.map(Row::parse).collect();
            rewrite |= parsed.iter().any(Option::is_none) || !text.ends_with('\n');
            let all: Vec<Row> = parsed.into_iter().flatten().collect();
            let complete: BTreeSet<CellKey> = {
                let mut count = std::collections::BTreeMap::<CellKey, usize>::new();
                for r in &all {
                    *count.entry(r.cell()).or_default() += 1;
                }
                all.iter()
                    .filter(|r| expected(r) == Some(count[&r.cell()]))
                    .map(Row::cell)
                    .collect()
            };
            let before = all.len();
            rows = all.into_iter().filter(|r| complete.contains(&r.cell())).collect();
            rewrite |= rows.len() != before;
        }
        if rewrite {
            write_rows(path, &rows)?;
        }
        let file = std::fs::OpenOptions::new()
            .append(true)
            .open(path)
            .map_err(|e| EngineError::io("cannot open for appending", path, e))?;
        Ok((
            ResultsFile {
                path: path.to_path_buf(),
                file,
            },
            rows,
        ))
    }

    /// Appends one cell's rows in a single write and flushes them to disk.
    pub fn append(&mut self, rows: &[Row]) -> Result<()> {
        let text: String = rows.iter().map(|r| r.to_line() + "\n").collect();
        self.file
            .write_all(text.as_bytes())
            .and_then(|()| self.file.sync_data())
            .map_err(|e| EngineError::io("cannot append to", &self.path, e))
    }
}

/// `rows` as the text of a results file: the header, then one line per row.
pub fn rows_text(rows: &[Row]) -> String {
    let mut text = format!("{HEADER}\n");
    for r in rows {
        text.push_str(&r.to_line());
        text.push('\n');
    }
    text
}

/// Writes `rows` as a whole results file at `path`, atomically.
pub fn write_rows(path: &Path, rows: &[Row]) -> Result<()> {
    mergescope_engine::writer::write_atomic(path, rows_text(rows).as_bytes())
}

/// Reads a results file (complete lines only), for plotting.
pub fn read_rows(path: &Path) -> Result<Vec<Row>> {
    let text = std::fs::read_to_string(path).map_err(|e| EngineError::io("cannot read", path, e))?;
    parse_rows(&text, path)
}

/// The rows of a results file's text `text` (read from `path`, named in errors).
pub fn parse_rows(text: &str, path: &Path) -> Result<Vec<Row>> {
    let mut lines = text.lines();
    if lines.next() != Some(HEADER) {
        return Err(EngineError::Invalid(format!(
            "'{}' is not a sweep results file (its header differs)",
            path.display()
        )));
    }
    Ok(lines.filter_map(Row::parse).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(group: usize, task: &str, method: &str) -> Row {
        Row {
            hyper: Hyper {
                lr: 5e-4,
                batch: 64,
                steps: 300,
                data_ratio: 1.0,
                optimizer: "adamw".into(),
                tasks: 2,
            },
            group: Some(group),
            group_tasks: "a+b".into(),
            method: method.into(),
            task: task.into(),
            accuracy: 0.5,
            loss: 1.25,
            examples: 10,
            seconds: 0.5,
        }
    }

    #[test]
    fn rows_round_trip_and_torn_or_short_cells_are_dropped_on_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("results.csv");
        let two = |_: &Row| Some(2);
        let (mut f, rows) = ResultsFile::open(&path, &two).unwrap();
        assert!(rows.is_empty());
        let done = [row(0, "a", "TA, 1/N"), row(0, "b", "TA, 1/N")];
        f.append(&done).unwrap();
        f.append(&[row(1, "a", "TA, 1/N")]).unwrap(); // a cell cut short
        drop(f);
        // A torn line, as a kill in the middle of a write would leave.
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str("0.0005,64,300,1,adamw,2,1,a+b,TA");
        std::fs::write(&path, text).unwrap();
        let (_, rows) = ResultsFile::open(&path, &two).unwrap();
        assert_eq!(rows, done);
        // Experts' cells are one row each, one per task: both are kept.
        let mut f = ResultsFile::open(&path, &|r: &Row| Some(if r.method == EXPERT { 1 } else { 2 }))
            .unwrap()
            .0;
        let experts = [row(0, "a", EXPERT), row(0, "b", EXPERT)].map(|r| Row { group: None, ..r });
        f.append(&experts).unwrap();
        drop(f);
        let (_, rows) = ResultsFile::open(&path, &|r: &Row| Some(if r.method == EXPERT { 1 } else { 2 })).unwrap();
        assert_eq!(rows.len(), 4, "{rows:?}");
        assert_eq!(read_rows(&path).unwrap()[..2], done, "the file itself was cleaned");
        std::fs::write(&path, "x,y\n1,2\n").unwrap();
        let e = ResultsFile::open(&path, &two).err().unwrap().to_string();
        assert!(e.contains("not a sweep results file"), "{e}");
    }
}
