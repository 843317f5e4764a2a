//! Values crossing the SQL layer: the four storage classes both engines share (integer, real,
//! text, blob, and NULL), how Rust types become them ([`ToSql`]) and come back ([`FromSql`]).
//!
//! The schema only uses those classes (PostgreSQL: BIGINT, DOUBLE PRECISION, TEXT, BYTEA), so
//! one conversion serves both engines; booleans are integers 0/1 on both, as SQLite keeps them.

use bytes::BytesMut;
use tokio_postgres::types::{IsNull, ToSql as PgToSql, Type};

use super::SqlError;

/// A borrowed value, as bound to a statement or read from a row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ValueRef<'a> {
    Null,
    Integer(i64),
    Real(f64),
    Text(&'a str),
    Blob(&'a [u8]),
}

impl ValueRef<'_> {
    pub(crate) fn class(&self) -> &'static str {
        match self {
            ValueRef::Null => "NULL",
            ValueRef::Integer(_) => "an integer",
            ValueRef::Real(_) => "a real",
            ValueRef::Text(_) => "text",
            ValueRef::Blob(_) => "a blob",
        }
    }
}

impl rusqlite::ToSql for ValueRef<'_> {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        use rusqlite::types::{ToSqlOutput, ValueRef as V};
        Ok(ToSqlOutput::Borrowed(match *self {
            ValueRef::Null => V::Null,
            ValueRef::Integer(v) => V::Integer(v),
            ValueRef::Real(v) => V::Real(v),
            ValueRef::Text(s) => V::Text(s.as_bytes()),
            ValueRef::Blob(b) => V::Blob(b),
        }))
    }
}

type BoxError = Box<dyn std::error::Error + Sync + Send>;

/// Binds to whatever type PostgreSQL inferred for the placeholder: an integer may fill a
/// BIGINT, INTEGER or DOUBLE PRECISION parameter, text a TEXT one, and so on.
impl PgToSql for ValueRef<'_> {
    fn to_sql(&self, ty: &Type, out: &mut BytesMut) -> Result<IsNull, BoxError> {
        match *self {
            ValueRef::Null => Ok(IsNull::Yes),
            ValueRef::Integer(v) => match *ty {
                Type::INT8 => v.to_sql(ty, out),
                Type::INT4 => i32::try_from(v)?.to_sql(ty, out),
                Type::INT2 => i16::try_from(v)?.to_sql(ty, out),
                Type::FLOAT8 => (v as f64).to_sql(ty, out),
                Type::BOOL => (v != 0).to_sql(ty, out),
                Type::TEXT | Type::VARCHAR => v.to_string().to_sql(ty, out),
                _ => Err(format!("an integer cannot fill a {ty} parameter").into()),
            },
            ValueRef::Real(v) => match *ty {
                Type::FLOAT8 => v.to_sql(ty, out),
                Type::FLOAT4 => (v as f32).to_sql(ty, out),
                _ => Err(format!("a real cannot fill a {ty} parameter").into()),
            },
            ValueRef::Text(s) => match *ty {
                Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::UNKNOWN => {
                    s.to_sql(&Type::TEXT, out)
                }
                // SQLite lets text sit in a BLOB column; its bytes are what was meant.
                Type::BYTEA => s.as_bytes().to_sql(ty, out),
                _ => Err(format!("text cannot fill a {ty} parameter").into()),
            },
            ValueRef::Blob(b) => match *ty {
                Type::BYTEA => b.to_sql(ty, out),
                _ => Err(format!("a blob cannot fill a {ty} parameter").into()),
            },
        }
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    tokio_postgres::types::to_sql_checked!();
}

/// Reads column `i` of a PostgreSQL row as one of the shared classes.
pub(crate) fn pg_value(row: &tokio_postgres::Row, i: usize) -> Result<ValueRef<'_>, SqlError> {
    let Some(column) = row.columns().get(i) else {
        return Err(SqlError::Convert {
            column: i,
            message: format!("no such column (the row has {})", row.len()),
        });
    };
    let ty = column.type_().clone();
    let pg = |e: tokio_postgres::Error| SqlError::Postgres(e);
    let v = match ty {
        Type::INT8 => row
            .try_get::<_, Option<i64>>(i)
            .map_err(pg)?
            .map(ValueRef::Integer),
        Type::INT4 => row
            .try_get::<_, Option<i32>>(i)
            .map_err(pg)?
            .map(|v| ValueRef::Integer(v.into())),
        Type::INT2 => row
            .try_get::<_, Option<i16>>(i)
            .map_err(pg)?
            .map(|v| ValueRef::Integer(v.into())),
        Type::BOOL => row
            .try_get::<_, Option<bool>>(i)
            .map_err(pg)?
            .map(|v| ValueRef::Integer(v.into())),
        Type::FLOAT8 => row
            .try_get::<_, Option<f64>>(i)
            .map_err(pg)?
            .map(ValueRef::Real),
        Type::FLOAT4 => row
            .try_get::<_, Option<f32>>(i)
            .map_err(pg)?
            .map(|v| ValueRef::Real(v.into())),
        Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME => row
            .try_get::<_, Option<&str>>(i)
            .map_err(pg)?
            .map(ValueRef::Text),
        Type::BYTEA => row
            .try_get::<_, Option<&[u8]>>(i)
            .map_err(pg)?
            .map(ValueRef::Blob),
        other => {
            return Err(SqlError::Convert {
                column: i,
                message: format!(
                    "column type {other} is not one the store reads (cast it to BIGINT, \
                     DOUBLE PRECISION, TEXT or BYTEA in the query)"
                ),
            })
        }
    };
    Ok(v.unwrap_or(ValueRef::Null))
}

pub(crate) fn sqlite_value<'a>(
    row: &'a rusqlite::Row<'_>,
    i: usize,
) -> Result<ValueRef<'a>, SqlError> {
    use rusqlite::types::ValueRef as V;
    Ok(match row.get_ref(i)? {
        V::Null => ValueRef::Null,
        V::Integer(v) => ValueRef::Integer(v),
        V::Real(v) => ValueRef::Real(v),
        V::Text(t) => ValueRef::Text(std::str::from_utf8(t).map_err(|e| SqlError::Convert {
            column: i,
            message: format!("text is not UTF-8: {e}"),
        })?),
        V::Blob(b) => ValueRef::Blob(b),
    })
}

/// A Rust value that can be bound to a statement.
pub trait ToSql {
    fn to_value(&self) -> Result<ValueRef<'_>, SqlError>;
}

impl<T: ToSql + ?Sized> ToSql for &T {
    fn to_value(&self) -> Result<ValueRef<'_>, SqlError> {
        (**self).to_value()
    }
}

impl<T: ToSql> ToSql for Option<T> {
    fn to_value(&self) -> Result<ValueRef<'_>, SqlError> {
        match self {
            Some(v) => v.to_value(),
            None => Ok(ValueRef::Null),
        }
    }
}

macro_rules! to_sql_integer {
    ($($t:ty),*) => {$(
        impl ToSql for $t {
            fn to_value(&self) -> Result<ValueRef<'_>, SqlError> {
                i64::try_from(*self)
                    .map(ValueRef::Integer)
                    .map_err(|_| SqlError::Param(format!("{} does not fit a signed 64-bit integer", self)))
            }
        }
    )*};
}
to_sql_integer!(i8, i16, i32, i64, u8, u16, u32, u64, usize, isize);

impl ToSql for bool {
    fn to_value(&self) -> Result<ValueRef<'_>, SqlError> {
        Ok(ValueRef::Integer(i64::from(*self)))
    }
}

impl ToSql for f64 {
    fn to_value(&self) -> Result<ValueRef<'_>, SqlError> {
        Ok(ValueRef::Real(*self))
    }
}

impl ToSql for str {
    fn to_value(&self) -> Result<ValueRef<'_>, SqlError> {
        Ok(ValueRef::Text(self))
    }
}

impl ToSql for String {
    fn to_value(&self) -> Result<ValueRef<'_>, SqlError> {
        Ok(ValueRef::Text(self))
    }
}

impl ToSql for [u8] {
    fn to_value(&self) -> Result<ValueRef<'_>, SqlError> {
        Ok(ValueRef::Blob(self))
    }
}

impl ToSql for Vec<u8> {
    fn to_value(&self) -> Result<ValueRef<'_>, SqlError> {
        Ok(ValueRef::Blob(self))
    }
}

impl ToSql for ValueRef<'_> {
    fn to_value(&self) -> Result<ValueRef<'_>, SqlError> {
        Ok(*self)
    }
}

/// An owned value (copying rows between stores).
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Integer(i64),
    Real(f64),
    Text(String),
    Blob(Vec<u8>),
}

impl ToSql for Value {
    fn to_value(&self) -> Result<ValueRef<'_>, SqlError> {
        Ok(match self {
            Value::Null => ValueRef::Null,
            Value::Integer(v) => ValueRef::Integer(*v),
            Value::Real(v) => ValueRef::Real(*v),
            Value::Text(s) => ValueRef::Text(s),
            Value::Blob(b) => ValueRef::Blob(b),
        })
    }
}

/// A Rust value a column can be read as.
pub trait FromSql: Sized {
    /// `Err` carries a message; the caller adds the column.
    fn from_value(v: ValueRef<'_>) -> Result<Self, String>;
}

fn wrong(v: ValueRef<'_>, want: &str) -> String {
    format!("{} where {want} was expected", v.class())
}

impl<T: FromSql> FromSql for Option<T> {
    fn from_value(v: ValueRef<'_>) -> Result<Self, String> {
        match v {
            ValueRef::Null => Ok(None),
            v => T::from_value(v).map(Some),
        }
    }
}

macro_rules! from_sql_integer {
    ($($t:ty),*) => {$(
        impl FromSql for $t {
            fn from_value(v: ValueRef<'_>) -> Result<Self, String> {
                match v {
                    ValueRef::Integer(i) => <$t>::try_from(i)
                        .map_err(|_| format!("{i} is out of range for {}", stringify!($t))),
                    v => Err(wrong(v, "an integer")),
                }
            }
        }
    )*};
}
from_sql_integer!(i8, i16, i32, i64, u8, u16, u32, u64, usize);

impl FromSql for bool {
    fn from_value(v: ValueRef<'_>) -> Result<Self, String> {
        match v {
            ValueRef::Integer(i) => Ok(i != 0),
            v => Err(wrong(v, "an integer (boolean)")),
        }
    }
}

impl FromSql for f64 {
    fn from_value(v: ValueRef<'_>) -> Result<Self, String> {
        match v {
            ValueRef::Real(f) => Ok(f),
            ValueRef::Integer(i) => Ok(i as f64),
            v => Err(wrong(v, "a real")),
        }
    }
}

impl FromSql for String {
    fn from_value(v: ValueRef<'_>) -> Result<Self, String> {
        match v {
            ValueRef::Text(s) => Ok(s.to_owned()),
            v => Err(wrong(v, "text")),
        }
    }
}

impl FromSql for Vec<u8> {
    fn from_value(v: ValueRef<'_>) -> Result<Self, String> {
        match v {
            ValueRef::Blob(b) => Ok(b.to_vec()),
            // SQLite hands back text written into a BLOB column as text.
            ValueRef::Text(s) => Ok(s.as_bytes().to_vec()),
            v => Err(wrong(v, "a blob")),
        }
    }
}

impl FromSql for Value {
    fn from_value(v: ValueRef<'_>) -> Result<Self, String> {
        Ok(match v {
            ValueRef::Null => Value::Null,
            ValueRef::Integer(i) => Value::Integer(i),
            ValueRef::Real(f) => Value::Real(f),
            ValueRef::Text(s) => Value::Text(s.to_owned()),
            ValueRef::Blob(b) => Value::Blob(b.to_vec()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_convert_with_range_checks() {
        assert_eq!(u16::from_value(ValueRef::Integer(443)), Ok(443));
        assert!(u16::from_value(ValueRef::Integer(-1)).is_err());
        assert_eq!(bool::from_value(ValueRef::Integer(1)), Ok(true));
        assert_eq!(f64::from_value(ValueRef::Integer(2)), Ok(2.0));
        assert_eq!(Option::<i64>::from_value(ValueRef::Null), Ok(None));
        assert!(String::from_value(ValueRef::Integer(1)).is_err());
        assert!(u64::MAX.to_value().is_err());
        assert_eq!(true.to_value().unwrap(), ValueRef::Integer(1));
    }
}
