//! Secrets read from environment variables. They print as `***` so a stray `{:?}` in a log
//! line or an error can never leak them.
//!
//! Bearer tokens (the admin token, the ingest token, the proxy's client keys) are checked
//! here, one way for all: the given token's and each secret's SHA-256 digests are compared in
//! constant time, so neither a secret's content nor its length leaks through timing.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, PoisonError, RwLock};

use axum::http::{header, HeaderMap};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// Why a bearer token was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// The variable that holds the token is unset or empty: the endpoints it guards are off.
    #[error("the token variable is not set")]
    Disabled,
    #[error("missing or wrong bearer token")]
    Unauthorized,
}

/// The token of an `Authorization: Bearer <token>` header, trimmed; `None` for no header,
/// another scheme or an empty token.
pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|t| !t.is_empty())
}

/// Whether `given` is one of `secrets`. Every secret is compared, matched or not.
pub fn matches_any<'a>(given: &str, secrets: impl IntoIterator<Item = &'a Secret>) -> bool {
    let given = Sha256::digest(given.as_bytes());
    let matched = secrets
        .into_iter()
        .fold(subtle::Choice::from(0u8), |acc, s| {
            acc | Sha256::digest(s.expose().as_bytes()).ct_eq(&given)
        });
    bool::from(matched)
}

/// The SHA-256 digest a key is kept as (the proxy's named clients keep only this).
pub fn digest(value: &str) -> [u8; 32] {
    Sha256::digest(value.as_bytes()).into()
}

/// Which of `digests` is the digest of `given`, compared in constant time: every digest is
/// compared, matched or not, and the position is picked without branching on the bytes.
pub fn which_digest(given: &str, digests: &[[u8; 32]]) -> Option<usize> {
    let given = digest(given);
    use subtle::ConditionallySelectable;
    let (mut index, mut any) = (0u64, subtle::Choice::from(0u8));
    for (i, d) in digests.iter().enumerate() {
        let hit = d.ct_eq(&given);
        index.conditional_assign(&(i as u64), hit);
        any |= hit;
    }
    bool::from(any)
        .then(|| usize::try_from(index).ok())
        .flatten()
}

/// Checks the request's bearer token against the variable `var` names in `env`, read now so
/// a rotated token takes effect at once.
pub fn check_bearer_env(env: &Env, var: &str, headers: &HeaderMap) -> Result<(), AuthError> {
    check_bearer(env.secret(var).as_ref(), headers)
}

/// Checks the request's bearer token against `expected`; `None` means the endpoints it
/// guards are off.
pub fn check_bearer(expected: Option<&Secret>, headers: &HeaderMap) -> Result<(), AuthError> {
    let expected = expected.ok_or(AuthError::Disabled)?;
    match bearer(headers) {
        Some(given) if matches_any(given, [expected]) => Ok(()),
        _ => Err(AuthError::Unauthorized),
    }
}

/// Where secrets are read: the process environment (the service, the default) or values
/// given in code (tests, embedders). Changing the environment of a running process races
/// with every thread that reads it (glibc's `setenv` is not thread-safe), so code that needs
/// other values is given an `Env` instead. Clones share one set of given values, so a value
/// set or removed later is seen at once, as a rotated variable would be.
#[derive(Clone, Default)]
pub struct Env(Option<Arc<RwLock<HashMap<String, String>>>>);

impl Env {
    /// The process environment.
    pub fn process() -> Self {
        Self(None)
    }

    /// Given values only, none yet: the process environment is never consulted.
    pub fn given() -> Self {
        Self(Some(Arc::default()))
    }

    /// Sets `var` (a process environment becomes given values holding only it). Returns
    /// `self` for chaining.
    pub fn set(&mut self, var: impl Into<String>, value: impl Into<String>) -> &mut Self {
        let map = self.0.get_or_insert_with(Arc::default);
        map.write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(var.into(), value.into());
        self
    }

    /// [`Self::set`], by value.
    #[must_use]
    pub fn with(mut self, var: impl Into<String>, value: impl Into<String>) -> Self {
        self.set(var, value);
        self
    }

    /// Unsets `var` among the given values (the process environment is never changed).
    pub fn remove(&self, var: &str) {
        if let Some(map) = &self.0 {
            map.write()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(var);
        }
    }

    /// The variable's value; unset or empty is `None`.
    pub fn secret(&self, var: &str) -> Option<Secret> {
        match &self.0 {
            None => Secret::from_env(var),
            Some(map) => map
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .get(var)
                .filter(|v| !v.is_empty())
                .map(|v| Secret::new(v.clone())),
        }
    }
}

impl fmt::Debug for Env {
    /// Names where values come from, never a value.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            None => f.write_str("Env(process)"),
            Some(_) => f.write_str("Env(given)"),
        }
    }
}

#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// Reads the variable from the process environment; unset or empty is `None`. Code
    /// that can be given its values reads them through an [`Env`] instead.
    pub fn from_env(var: &str) -> Option<Self> {
        std::env::var(var).ok().filter(|v| !v.is_empty()).map(Self)
    }

    /// The only way to the value: call it where the secret leaves the process.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_never_format() {
        let s = Secret::new("sk-very-secret");
        assert_eq!(format!("{s} {s:?}"), "*** Secret(***)");
        assert_eq!(s.expose(), "sk-very-secret");
    }

    fn auth(value: &'static str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, value.parse().unwrap());
        h
    }

    #[test]
    fn bearer_reads_only_the_bearer_scheme() {
        assert_eq!(bearer(&HeaderMap::new()), None);
        assert_eq!(bearer(&auth("Bearer s3cret")), Some("s3cret"));
        assert_eq!(bearer(&auth("Basic s3cret")), None);
        assert_eq!(bearer(&auth("Bearer ")), None);
        assert_eq!(bearer(&auth("bearer s3cret")), None);
    }

    #[test]
    fn tokens_match_exactly_whatever_their_lengths() {
        let keys = [Secret::new("s3cret"), Secret::new("other-key")];
        assert!(matches_any("s3cret", &keys));
        assert!(matches_any("other-key", &keys));
        assert!(!matches_any("s3cre", &keys));
        assert!(!matches_any("s3cret!", &keys));
        assert!(!matches_any("", &keys));
        assert!(!matches_any("s3cret", []));
    }

    #[test]
    fn an_unset_variable_disables_the_check() {
        // A variable name no test or environment sets.
        let var = "PROBEOK_TEST_SECRET_NEVER_SET_9F2C";
        assert_eq!(
            check_bearer_env(&Env::process(), var, &auth("Bearer x")),
            Err(AuthError::Disabled)
        );
    }

    #[test]
    fn given_values_are_shared_by_clones_and_never_read_the_process() {
        let mut env = Env::given();
        let seen = env.clone();
        // PATH is set in every process environment; given values do not fall back to it.
        assert_eq!(env.secret("PATH"), None);
        env.set("T_TOKEN", "s3cret").set("T_EMPTY", "");
        assert_eq!(seen.secret("T_TOKEN").unwrap().expose(), "s3cret");
        assert_eq!(seen.secret("T_EMPTY"), None, "empty counts as unset");
        assert_eq!(
            check_bearer_env(&seen, "T_TOKEN", &auth("Bearer s3cret")),
            Ok(())
        );
        env.remove("T_TOKEN");
        assert_eq!(
            check_bearer_env(&seen, "T_TOKEN", &auth("Bearer s3cret")),
            Err(AuthError::Disabled)
        );
        assert_eq!(format!("{:?}", Env::given().with("K", "v")), "Env(given)");
    }
}
