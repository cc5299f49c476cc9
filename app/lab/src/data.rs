//! Task data for evaluation: small image-classification tasks stored as safetensors files
//! (`train_images` U8 [N, H, W], `train_labels` U8 [N], `test_images`, `test_labels`, and
//! `task`/`classes` in the header metadata). The demo benchmark's seven tasks live in
//! `assets/data/` and are compiled into the binary; a user adds a task by dropping a file of
//! the same layout into [`user_task_dir`] (or points the CLI at a folder of their own).

use mergescope_engine::error::{EngineError, Result};
use safetensors::SafeTensors;
use safetensors::tensor::TensorView;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One split of a task.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Split {
    /// Images, row-major [n, height, width], 0 = background, 255 = ink.
    pub images: Vec<u8>,
    /// Labels in `0..classes.len()`.
    pub labels: Vec<u8>,
}

impl Split {
    /// Number of examples.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether the split has no examples.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }
}

/// A classification task.
#[derive(Clone, Debug)]
pub struct TaskData {
    /// Task name (`task` metadata).
    pub name: String,
    /// Class names, in label order.
    pub classes: Vec<String>,
    /// Image height and width.
    pub image_size: (usize, usize),
    /// Training split.
    pub train: Split,
    /// Test split.
    pub test: Split,
    /// All header metadata (source, licence, preprocessing…).
    pub metadata: BTreeMap<String, String>,
}

/// The demo benchmark's tasks, compiled into the binary so the app works from anywhere.
const EMBEDDED: [(&str, &[u8]); 7] = [
    (
        "animal_mnist",
        include_bytes!("../../../assets/data/animal_mnist.safetensors"),
    ),
    (
        "fashion_mnist",
        include_bytes!("../../../assets/data/fashion_mnist.safetensors"),
    ),
    ("ising", include_bytes!("../../../assets/data/ising.safetensors")),
    ("letters", include_bytes!("../../../assets/data/letters.safetensors")),
    ("mnist", include_bytes!("../../../assets/data/mnist.safetensors")),
    (
        "opencv_digits",
        include_bytes!("../../../assets/data/opencv_digits.safetensors"),
    ),
    (
        "optdigits",
        include_bytes!("../../../assets/data/optdigits.safetensors"),
    ),
];

/// Examples taken from the start of each task's train split as calibration data for
/// data-driven merge methods (DESIGN §4); never from the test split.
pub const CALIBRATION_PER_TASK: usize = 100;

/// Which examples of a task to evaluate on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SplitKind {
    /// The test split.
    Test,
    /// The first [`CALIBRATION_PER_TASK`] examples of the train split.
    Calibration,
}

impl SplitKind {
    /// Parses `test` or `calibration`.
    pub fn parse(s: &str) -> Option<SplitKind> {
        match s {
            "test" => Some(SplitKind::Test),
            "calibration" | "calib" => Some(SplitKind::Calibration),
            _ => None,
        }
    }

    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            SplitKind::Test => "test",
            SplitKind::Calibration => "calibration",
        }
    }
}

impl TaskData {
    /// The examples of `kind` (calibration: a prefix of the train split).
    pub fn split(&self, kind: SplitKind) -> Split {
        match kind {
            SplitKind::Test => self.test.clone(),
            SplitKind::Calibration => {
                let n = CALIBRATION_PER_TASK.min(self.train.len());
                let per = self.image_size.0 * self.image_size.1;
                Split {
                    images: self.train.images[..n * per].to_vec(),
                    labels: self.train.labels[..n].to_vec(),
                }
            }
        }
    }
}

fn u8_tensor<'a>(st: &'a SafeTensors<'a>, path: &Path, name: &str, rank: usize) -> Result<TensorView<'a>> {
    let t = st.tensor(name).map_err(|_| {
        EngineError::bad(
            path,
            format!("not a task file: tensor '{name}' is missing (a task has train_images, train_labels, test_images, test_labels)"),
        )
    })?;
    if t.dtype() != safetensors::Dtype::U8 {
        return Err(EngineError::bad(
            path,
            format!("tensor '{name}' is {:?}, a task needs U8", t.dtype()),
        ));
    }
    if t.shape().len() != rank {
        return Err(EngineError::bad(
            path,
            format!("tensor '{name}' has shape {:?}; a task needs rank {rank}", t.shape()),
        ));
    }
    Ok(t)
}

fn split(
    st: &SafeTensors<'_>,
    path: &Path,
    which: &str,
    n_classes: usize,
    size: Option<(usize, usize)>,
) -> Result<(Split, (usize, usize))> {
    let images = u8_tensor(st, path, &format!("{which}_images"), 3)?;
    let labels = u8_tensor(st, path, &format!("{which}_labels"), 1)?;
    let (n, h, w) = (images.shape()[0], images.shape()[1], images.shape()[2]);
    if labels.shape()[0] != n {
        return Err(EngineError::bad(
            path,
            format!("{which}: {n} images but {} labels", labels.shape()[0]),
        ));
    }
    if n == 0 {
        return Err(EngineError::bad(path, format!("the {which} split has no examples")));
    }
    if let Some((h0, w0)) = size.filter(|s| *s != (h, w)) {
        return Err(EngineError::bad(
            path,
            format!("{which} images are {h}×{w} but train images are {h0}×{w0}"),
        ));
    }
    let labels = labels.data().to_vec();
    if let Some((i, l)) = labels.iter().enumerate().find(|(_, l)| usize::from(**l) >= n_classes) {
        return Err(EngineError::bad(
            path,
            format!("{which}_labels[{i}] = {l}, but the metadata lists only {n_classes} classes"),
        ));
    }
    Ok((
        Split {
            images: images.data().to_vec(),
            labels,
        },
        (h, w),
    ))
}

/// Parses and checks a task file's bytes (`path` names it in messages).
pub fn parse_task(bytes: &[u8], path: &Path) -> Result<TaskData> {
    let (_, header) = SafeTensors::read_metadata(bytes).map_err(|e| EngineError::bad(path, e.to_string()))?;
    let metadata: BTreeMap<String, String> = header
        .metadata()
        .as_ref()
        .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
        .unwrap_or_default();
    let st = SafeTensors::deserialize(bytes).map_err(|e| EngineError::bad(path, e.to_string()))?;
    let name = metadata
        .get("task")
        .filter(|t| !t.is_empty())
        .cloned()
        .ok_or_else(|| EngineError::bad(path, "the header metadata has no 'task' name"))?;
    let classes: Vec<String> = metadata
        .get("classes")
        .map(|c| {
            c.split(',')
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
                .collect()
        })
        .unwrap_or_default();
    if classes.len() < 2 {
        return Err(EngineError::bad(
            path,
            "the header metadata must list at least two comma-separated 'classes'",
        ));
    }
    let (train, size) = split(&st, path, "train", classes.len(), None)?;
    let (test, _) = split(&st, path, "test", classes.len(), Some(size))?;
    Ok(TaskData {
        name,
        classes,
        image_size: size,
        train,
        test,
        metadata,
    })
}

/// Loads and checks one task file.
pub fn load_task(path: &Path) -> Result<TaskData> {
    let bytes = std::fs::read(path).map_err(|e| EngineError::io("cannot read", path, e))?;
    parse_task(&bytes, path)
}

fn check_unique(tasks: &mut [TaskData], origin: &str) -> Result<()> {
    tasks.sort_by(|a, b| a.name.cmp(&b.name));
    if let Some(w) = tasks.windows(2).find(|w| w[0].name == w[1].name) {
        return Err(EngineError::Invalid(format!(
            "two task files in {origin} define task '{}': rename one (the 'task' metadata key)",
            w[0].name
        )));
    }
    Ok(())
}

/// Loads every `*.safetensors` task in a folder, sorted by task name.
pub fn load_tasks(dir: &Path) -> Result<Vec<TaskData>> {
    let entries = std::fs::read_dir(dir).map_err(|e| EngineError::io("cannot list", dir, e))?;
    let mut tasks = Vec::new();
    for e in entries {
        let p = e.map_err(|e| EngineError::io("cannot list", dir, e))?.path();
        if p.extension().is_some_and(|x| x == "safetensors") {
            tasks.push(load_task(&p)?);
        }
    }
    check_unique(&mut tasks, &format!("'{}'", dir.display()))?;
    Ok(tasks)
}

/// The seven tasks of the demo benchmark, from the copies compiled into the binary.
pub fn demo_tasks() -> Result<Vec<TaskData>> {
    EMBEDDED
        .iter()
        .map(|(name, bytes)| parse_task(bytes, Path::new(&format!("assets/data/{name}.safetensors"))))
        .collect()
}

/// The user's own task folder: `$MERGESCOPE_DATA_DIR`, else `$XDG_DATA_HOME/mergescope/tasks`,
/// else `~/.local/share/mergescope/tasks`.
pub fn user_task_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("MERGESCOPE_DATA_DIR") {
        return Some(PathBuf::from(d));
    }
    let data = std::env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))?;
    Some(data.join("mergescope/tasks"))
}

/// The tasks a benchmark is built on: those of `dir` if given; otherwise the seven demo tasks
/// plus every task file in [`user_task_dir`] (if it exists), sorted by name.
pub fn benchmark_tasks(dir: Option<&Path>) -> Result<Vec<TaskData>> {
    if let Some(d) = dir {
        let tasks = load_tasks(d)?;
        if tasks.is_empty() {
            return Err(EngineError::Invalid(format!(
                "'{}' holds no task files (*.safetensors with train_images, train_labels, test_images, test_labels)",
                d.display()
            )));
        }
        return Ok(tasks);
    }
    let mut tasks = demo_tasks()?;
    if let Some(d) = user_task_dir().filter(|d| d.is_dir()) {
        tasks.extend(load_tasks(&d)?);
        check_unique(&mut tasks, &format!("the demo set and '{}'", d.display()))?;
    }
    Ok(tasks)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::{Digest as _, Sha256};
    use std::path::PathBuf;

    fn assets() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../assets/data")
    }

    #[test]
    fn the_seven_demo_tasks_load_balanced_and_intact() {
        let tasks = load_tasks(&assets()).unwrap();
        let names: Vec<&str> = tasks.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "animal_mnist",
                "fashion_mnist",
                "ising",
                "letters",
                "mnist",
                "opencv_digits",
                "optdigits"
            ]
        );
        for t in &tasks {
            assert_eq!(t.image_size, (28, 28), "{}", t.name);
            assert_eq!((t.train.len(), t.test.len()), (2000, 500), "{}", t.name);
            assert_eq!(t.train.images.len(), 2000 * 28 * 28);
            // Class-balanced splits (README): 2000/C train and 500/C test per class.
            let c = t.classes.len();
            for (split, n) in [(&t.train, 2000), (&t.test, 500)] {
                let mut counts = vec![0usize; c];
                split.labels.iter().for_each(|l| counts[usize::from(*l)] += 1);
                assert!(counts.iter().all(|k| *k == n / c), "{}: {counts:?}", t.name);
            }
            assert!(
                t.metadata.contains_key("license") && t.metadata.contains_key("source"),
                "{}",
                t.name
            );
        }
        assert_eq!(tasks[2].classes, ["below_Tc", "above_Tc"]);
        // The copies compiled into the binary are these files.
        let embedded = demo_tasks().unwrap();
        assert_eq!(embedded.len(), tasks.len());
        for (a, b) in embedded.iter().zip(&tasks) {
            assert_eq!((&a.name, &a.train, &a.test), (&b.name, &b.train, &b.test));
        }
        let calib = tasks[4].split(SplitKind::Calibration);
        assert_eq!(calib.len(), CALIBRATION_PER_TASK);
        assert_eq!(calib.labels, tasks[4].train.labels[..CALIBRATION_PER_TASK]);
        // The files are the published ones (SHA256SUMS beside them).
        let sums = std::fs::read_to_string(assets().join("SHA256SUMS")).unwrap();
        for line in sums.lines() {
            let (hash, file) = line.split_once("  ").unwrap();
            let digest = Sha256::digest(std::fs::read(assets().join(file)).unwrap());
            let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
            assert_eq!(hex, hash, "{file}");
        }
    }

    #[test]
    fn a_model_file_is_not_a_task() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("model.safetensors");
        let header =
            r#"{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"__metadata__":{"task":"x","classes":"a,b"}}"#;
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(header.as_bytes());
        bytes.extend_from_slice(&[0; 4]);
        std::fs::write(&p, bytes).unwrap();
        let e = load_task(&p).unwrap_err().to_string();
        assert!(
            e.contains("model.safetensors") && e.contains("'train_images' is missing"),
            "{e}"
        );
    }
}
