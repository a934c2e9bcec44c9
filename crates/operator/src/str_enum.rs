//! `str_enum!`, for the CRD's and the decisions' wire-string enums.

/// An enum whose values are fixed strings on the wire (a status field, an
/// annotation value): serde, `as_str` and `parse` from one list, so the
/// strings stay exactly as they were.
macro_rules! str_enum {
    ($(#[$m:meta])* $vis:vis enum $name:ident {
        $($(#[$vm:meta])* $var:ident = $s:literal),+ $(,)?
    }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
        $vis enum $name {
            $($(#[$vm])* #[serde(rename = $s)] $var),+
        }

        impl $name {
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$var => $s),+
                }
            }

            pub fn parse(s: &str) -> Option<Self> {
                match s {
                    $($s => Some($name::$var),)+
                    _ => None,
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}
