//! The RBAC a component ships, checked against what it asked the API-server double:
//! every request (method, path, query) read as the API server's authorizer reads it
//! (API group, resource or subresource, verb) must be allowed by a rule of the
//! component's ClusterRoles and Roles. Namespaces of Roles are not checked.

#![allow(dead_code)]

use super::apiserver::ApiServer;

/// The `(API group, resource[/subresource], verb)` of a request `METHOD path?query` as
/// the API server's authorizer sees it.
pub fn request_attributes(request: &str) -> (String, String, String) {
    let (method, url) = request.split_once(' ').unwrap();
    let (path, query) = url.split_once('?').unwrap_or((url, ""));
    let seg: Vec<&str> = path.split('/').filter(|x| !x.is_empty()).collect();
    let (group, mut rest) = match seg[0] {
        "api" => ("", &seg[2..]),
        _ => (seg[1], &seg[3..]),
    };
    if rest.len() > 2 && rest[0] == "namespaces" {
        rest = &rest[2..];
    }
    let resource = match rest.get(2) {
        Some(sub) => format!("{}/{sub}", rest[0]),
        None => rest[0].to_string(),
    };
    let watch = query
        .split('&')
        .any(|kv| kv == "watch=true" || kv == "watch=1");
    let verb = match (method, rest.len()) {
        ("GET", _) if watch => "watch",
        ("GET", 1) => "list",
        ("GET", _) => "get",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", _) => "delete",
        (m, _) => panic!("unexpected method {m}"),
    };
    (group.to_string(), resource, verb.to_string())
}

/// Every request the API-server double saw is one the ClusterRoles and Roles in
/// `rbac_file` allow: a verb missing there fails in a real cluster with 403 while every
/// test against the double passes.
pub fn assert_allows_every_request(s: &ApiServer, rbac_file: &str) {
    let text = std::fs::read_to_string(rbac_file).unwrap();
    let rules: Vec<serde_json::Value> = serde_saphyr::from_multiple::<serde_json::Value>(&text)
        .unwrap()
        .into_iter()
        .filter(|d| matches!(d["kind"].as_str(), Some("ClusterRole" | "Role")))
        .flat_map(|d| d["rules"].as_array().cloned().unwrap_or_default())
        .collect();
    assert_rules_allow_every_request(s, &rules);
}

/// Every request the API-server double saw is allowed by one of `rules` (RBAC
/// PolicyRules as JSON: `apiGroups`, `resources`, `verbs`, optional `resourceNames`).
pub fn assert_rules_allow_every_request(s: &ApiServer, rules: &[serde_json::Value]) {
    let has = |v: &serde_json::Value, x: &str| {
        v.as_array()
            .is_some_and(|l| l.iter().any(|e| e.as_str() == Some(x)))
    };
    let requests = s.requests();
    assert!(!requests.is_empty());
    // Discovery (`GET /api/v1`, `/apis/<group>/<version>`) is open to every
    // authenticated user (the `system:discovery` ClusterRole): no rule of ours needed.
    let discovery = |r: &str| {
        let path = r.split_once(' ').map_or("", |(_, u)| u);
        let path = path.split_once('?').map_or(path, |(p, _)| p);
        let seg: Vec<&str> = path.split('/').filter(|x| !x.is_empty()).collect();
        matches!(seg.as_slice(), ["api", _] | ["apis", _, _])
    };
    for r in requests.into_iter().filter(|r| !discovery(r)) {
        let (group, resource, verb) = request_attributes(&r);
        let name = request_name(&r);
        // A rule with resourceNames allows only requests naming one of them (never a
        // create, list or watch without a metadata.name field selector).
        let named = |rule: &serde_json::Value| match rule["resourceNames"].as_array() {
            None => true,
            Some(_) => name
                .as_deref()
                .is_some_and(|n| has(&rule["resourceNames"], n)),
        };
        assert!(
            rules.iter().any(|rule| has(&rule["apiGroups"], &group)
                && has(&rule["resources"], &resource)
                && has(&rule["verbs"], &verb)
                && named(rule)),
            "{r}: RBAC does not allow {verb} {resource} in API group {group:?}"
        );
    }
}

/// The object name a request names as the authorizer sees it: the path's name segment,
/// or a list/watch's `metadata.name` field selector; `None` for a create or a plain list.
pub fn request_name(request: &str) -> Option<String> {
    let (method, url) = request.split_once(' ')?;
    let (path, query) = url.split_once('?').unwrap_or((url, ""));
    let seg: Vec<&str> = path.split('/').filter(|x| !x.is_empty()).collect();
    let mut rest = match seg.first() {
        Some(&"api") => seg.get(2..)?,
        _ => seg.get(3..)?,
    };
    if rest.len() > 2 && rest[0] == "namespaces" {
        rest = &rest[2..];
    }
    match (method, rest.get(1)) {
        ("POST", _) if rest.len() < 3 => None,
        (_, Some(name)) => Some((*name).to_string()),
        _ => query
            .split('&')
            .find_map(|kv| kv.strip_prefix("fieldSelector=metadata.name%3D"))
            .or_else(|| {
                query
                    .split('&')
                    .find_map(|kv| kv.strip_prefix("fieldSelector=metadata.name="))
            })
            .map(String::from),
    }
}
