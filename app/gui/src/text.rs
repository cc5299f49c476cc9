//! How times read in the window: "12 s", "2m05s", "12 s elapsed, about 2m05s left".

/// A duration in seconds: whole seconds below 90 s, minutes and seconds above.
pub fn duration_text(seconds: f64) -> String {
    if seconds >= 90.0 {
        format!("{}m{:02}s", (seconds / 60.0) as u64, (seconds % 60.0) as u64)
    } else {
        format!("{seconds:.0} s")
    }
}

/// "12 s elapsed", or "12 s elapsed, about 30 s left" when the time left is known.
pub fn time_text(elapsed: f64, left: Option<f64>) -> String {
    match left {
        Some(l) => format!("{} elapsed, about {} left", duration_text(elapsed), duration_text(l)),
        None => format!("{} elapsed", duration_text(elapsed)),
    }
}

#[cfg(test)]
mod tests {
    use super::{duration_text, time_text};

    #[test]
    fn times_read_naturally() {
        assert_eq!(time_text(3.2, None), "3 s elapsed");
        assert_eq!(time_text(12.0, Some(125.0)), "12 s elapsed, about 2m05s left");
        assert_eq!(duration_text(89.4), "89 s");
        assert_eq!(duration_text(3600.0), "60m00s");
    }
}
