//! The few places the two SQL dialects differ, kept in one file. Queries are written once,
//! in the portable subset with SQLite's `?N` placeholders; PostgreSQL gets them rewritten to
//! `$N` once per statement (the result is cached with the prepared statement).

/// Which database engine a connection talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Engine {
    Sqlite,
    Postgres,
}

impl Engine {
    pub fn as_str(self) -> &'static str {
        match self {
            Engine::Sqlite => "sqlite",
            Engine::Postgres => "postgres",
        }
    }
}

/// `?N` → `$N`, and bare `?` → the next `$N`, outside string literals, quoted identifiers and
/// comments.
pub fn to_postgres(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len() + 8);
    let mut chars = sql.chars().peekable();
    let mut next = 0u32;
    while let Some(c) = chars.next() {
        match c {
            '\'' | '"' => {
                out.push(c);
                // Copy up to the closing quote; a doubled quote is an escaped one and simply
                // closes and reopens, which copying char by char handles.
                for d in chars.by_ref() {
                    out.push(d);
                    if d == c {
                        break;
                    }
                }
            }
            '-' if chars.peek() == Some(&'-') => {
                out.push(c);
                for d in chars.by_ref() {
                    out.push(d);
                    if d == '\n' {
                        break;
                    }
                }
            }
            '?' => {
                let mut digits = String::new();
                while let Some(d) = chars.peek().copied().filter(char::is_ascii_digit) {
                    digits.push(d);
                    chars.next();
                }
                out.push('$');
                if digits.is_empty() {
                    next += 1;
                    out.push_str(&next.to_string());
                } else {
                    out.push_str(&digits);
                }
            }
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_rewritten_outside_literals() {
        assert_eq!(
            to_postgres("SELECT a FROM t WHERE b = ?1 AND c = ?12 AND d = '?1' -- ?3\n AND e = ?"),
            "SELECT a FROM t WHERE b = $1 AND c = $12 AND d = '?1' -- ?3\n AND e = $1"
        );
        assert_eq!(
            to_postgres("UPDATE t SET e = 'it''s ?' WHERE \"q?\" = ?2"),
            "UPDATE t SET e = 'it''s ?' WHERE \"q?\" = $2"
        );
    }
}
