//! Reading series back from a Prometheus text page (the agent's or the controller's
//! `/metrics`), as the tests compare them.

#![allow(dead_code)]

/// The values of the series of `name` whose labels include all of `labels`, in page order.
pub fn series(page: &str, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
    let prefix = format!("{name}{{");
    page.lines()
        .filter(|l| l.starts_with(&prefix))
        .filter(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect()
}

/// The value of the first series of `name` whose labels include all of `labels`.
pub fn value(page: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    series(page, name, labels).into_iter().next()
}
