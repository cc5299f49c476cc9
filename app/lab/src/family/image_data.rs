//! Image-classification data as users keep it: a folder with one subfolder per class holding
//! PNG or JPEG files, and the CLIP preprocessing (shortest side resized to the model's size
//! with bicubic filtering, centre crop, scaled to [0, 1] and normalised with CLIP's channel
//! means and deviations).

use candle_core::{Device, Tensor};
use mergescope_engine::error::{EngineError, Result};
use rayon::prelude::*;
use std::path::{Path, PathBuf};

/// CLIP's per-channel mean (RGB).
pub const CLIP_MEAN: [f32; 3] = [0.481_454_66, 0.457_827_5, 0.408_210_73];
/// CLIP's per-channel standard deviation (RGB).
pub const CLIP_STD: [f32; 3] = [0.268_629_5, 0.261_302_6, 0.275_777_1];

/// One labelled image.
#[derive(Clone, Debug, PartialEq)]
pub struct ImageExample {
    /// The file.
    pub path: PathBuf,
    /// Class index.
    pub label: usize,
}

fn is_image(p: &Path) -> bool {
    p.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| matches!(e.to_ascii_lowercase().as_str(), "png" | "jpg" | "jpeg"))
}

/// The classes and images of an image folder: `classes` in that order (each a subfolder), or
/// every subfolder in name order; images in name order within each class.
pub fn read_image_folder(dir: &Path, classes: Option<&[String]>) -> Result<(Vec<String>, Vec<ImageExample>)> {
    let names: Vec<String> = match classes {
        Some(c) => c.to_vec(),
        None => {
            let mut v: Vec<String> = std::fs::read_dir(dir)
                .map_err(|e| EngineError::io("read the image folder", dir, e))?
                .filter_map(|e| e.ok())
                .filter(|e| e.path().is_dir())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            v.sort();
            v
        }
    };
    if names.is_empty() {
        return Err(EngineError::evaluator(format!(
            "'{}' has no class subfolders; put each class's images in a subfolder named after it",
            dir.display()
        )));
    }
    let mut examples = Vec::new();
    for (label, class) in names.iter().enumerate() {
        let sub = dir.join(class);
        let mut files: Vec<PathBuf> = std::fs::read_dir(&sub)
            .map_err(|e| EngineError::io("read the class folder", &sub, e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| is_image(p))
            .collect();
        files.sort();
        if files.is_empty() {
            return Err(EngineError::evaluator(format!(
                "class folder '{}' holds no .png or .jpg images",
                sub.display()
            )));
        }
        examples.extend(files.into_iter().map(|path| ImageExample { path, label }));
    }
    Ok((names, examples))
}

/// One image as CLIP sees it: `[3, size, size]` values, channel-major.
pub fn preprocess(path: &Path, size: usize) -> Result<Vec<f32>> {
    let img = image::open(path)
        .map_err(|e| EngineError::evaluator(format!("cannot read image '{}': {e}", path.display())))?
        .to_rgb8();
    let (w, h) = (img.width() as usize, img.height() as usize);
    if w == 0 || h == 0 {
        return Err(EngineError::evaluator(format!("image '{}' is empty", path.display())));
    }
    // Shortest side to `size`, as CLIPImageProcessor does (the other side rounded).
    let img = if w.min(h) == size {
        img
    } else {
        let (nw, nh) = if w <= h {
            (size, ((h * size) as f64 / w as f64).round() as usize)
        } else {
            (((w * size) as f64 / h as f64).round() as usize, size)
        };
        image::imageops::resize(&img, nw as u32, nh as u32, image::imageops::FilterType::CatmullRom)
    };
    let (w, h) = (img.width() as usize, img.height() as usize);
    let top = ((h - size) as f64 / 2.0).round() as usize;
    let left = ((w - size) as f64 / 2.0).round() as usize;
    let mut out = vec![0f32; 3 * size * size];
    for y in 0..size {
        for x in 0..size {
            let p = img.get_pixel((left + x) as u32, (top + y) as u32).0;
            for c in 0..3 {
                out[c * size * size + y * size + x] = (f32::from(p[c]) / 255.0 - CLIP_MEAN[c]) / CLIP_STD[c];
            }
        }
    }
    Ok(out)
}

/// The preprocessed pixels of `examples`, `[n, 3, size, size]`, decoded in parallel.
pub fn pixels(examples: &[ImageExample], size: usize, device: &Device) -> Result<Tensor> {
    let per: Vec<Vec<f32>> = examples
        .par_iter()
        .map(|e| preprocess(&e.path, size))
        .collect::<Result<_>>()?;
    let flat: Vec<f32> = per.into_iter().flatten().collect();
    Ok(Tensor::from_vec(flat, (examples.len(), 3, size, size), device)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn save(path: &Path, w: u32, h: u32, f: impl Fn(u32, u32) -> [u8; 3]) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        image::RgbImage::from_fn(w, h, |x, y| image::Rgb(f(x, y)))
            .save(path)
            .unwrap();
    }

    #[test]
    fn a_folder_gives_classes_in_order_and_pixels_normalised() {
        let dir = tempfile::tempdir().unwrap();
        save(&dir.path().join("b/1.png"), 4, 4, |_, _| [255, 0, 128]);
        save(&dir.path().join("a/2.png"), 6, 4, |x, _| {
            if (1..=4).contains(&x) {
                [255, 255, 255]
            } else {
                [0, 0, 0]
            }
        });
        std::fs::write(dir.path().join("a/notes.txt"), "x").unwrap();
        let (classes, ex) = read_image_folder(dir.path(), None).unwrap();
        assert_eq!(classes, ["a", "b"]);
        assert_eq!(ex.iter().map(|e| e.label).collect::<Vec<_>>(), [0, 1]);
        // Exact size: only normalisation.
        let p = preprocess(&ex[1].path, 4).unwrap();
        assert!((p[0] - (1.0 - CLIP_MEAN[0]) / CLIP_STD[0]).abs() < 1e-6);
        assert!((p[16] - (0.0 - CLIP_MEAN[1]) / CLIP_STD[1]).abs() < 1e-6);
        // 6×4 to 4: the shortest side is already 4, so the centre crop drops one column on
        // each side, leaving the white middle.
        let p = preprocess(&ex[0].path, 4).unwrap();
        assert!(
            p[..16]
                .iter()
                .all(|v| (v - (1.0 - CLIP_MEAN[0]) / CLIP_STD[0]).abs() < 1e-6),
            "{p:?}"
        );
        // Resizing a uniform image keeps it uniform.
        save(&dir.path().join("c/u.png"), 10, 7, |_, _| [40, 90, 200]);
        let p = preprocess(&dir.path().join("c/u.png"), 5).unwrap();
        assert!(
            p[50..75]
                .iter()
                .all(|v| (v - (200.0 / 255.0 - CLIP_MEAN[2]) / CLIP_STD[2]).abs() < 1e-5)
        );
        let t = pixels(&ex, 4, &Device::Cpu).unwrap();
        assert_eq!(t.dims(), [2, 3, 4, 4]);
    }

    #[test]
    fn folder_mistakes_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let e = read_image_folder(dir.path(), None).unwrap_err().to_string();
        assert!(e.contains("no class subfolders"), "{e}");
        std::fs::create_dir(dir.path().join("x")).unwrap();
        let e = read_image_folder(dir.path(), None).unwrap_err().to_string();
        assert!(e.contains("holds no .png"), "{e}");
        let e = read_image_folder(dir.path(), Some(&["y".to_owned()]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("'") && e.contains("y"), "{e}");
        std::fs::write(dir.path().join("x/bad.png"), "not a png").unwrap();
        let e = preprocess(&dir.path().join("x/bad.png"), 4).unwrap_err().to_string();
        assert!(e.contains("bad.png"), "{e}");
    }
}
