#![doc(hidden)]
//! Check functions shared by the fuzz targets (fuzz/) and the corpus replay tests (tests/).
