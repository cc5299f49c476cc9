//! mergescope's figures: plain data for every analysis view ([`Figure`]), written as CSV
//! ([`to_csv`]) and rendered to PNG headless ([`render_png`]). The GUI draws the same data
//! interactively, so a picture saved from the window and one made by `mergescope analyze`
//! show the same numbers.

pub mod colormap;
pub mod contour;
pub mod csv;
pub mod model;
pub mod png;
pub mod radar;

pub use csv::to_csv;
pub use model::*;
pub use png::render_png;

/// Why a figure could not be made.
#[derive(Debug, thiserror::Error)]
pub enum FigureError {
    /// The renderer failed.
    #[error("could not draw the figure: {0}")]
    Render(String),
    /// There is nothing to draw.
    #[error("the figure '{0}' has no data to draw")]
    Empty(String),
}
