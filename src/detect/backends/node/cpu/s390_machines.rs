//! IBM Z machine types (the `machine = 2964` of `/proc/cpuinfo` on s390x) and the generation
//! each one is, from IBM's announcement letters and the Linux kernel's s390 machine tables.

/// Generation names by machine type; a type not listed is named by its number.
const MACHINES: &[(&str, &str)] = &[
    ("2817", "IBM z196"),
    ("2818", "IBM z114"),
    ("2827", "IBM zEC12"),
    ("2828", "IBM zBC12"),
    ("2964", "IBM z13"),
    ("2965", "IBM z13s"),
    ("3906", "IBM z14"),
    ("3907", "IBM z14 ZR1"),
    ("8561", "IBM z15"),
    ("8562", "IBM z15 T02"),
    ("3931", "IBM z16"),
    ("3932", "IBM z16 A02"),
    ("9175", "IBM z17"),
];

/// The model name for a machine type: `IBM z13 (2964)`, or `IBM Z 1234` when unknown.
pub(super) fn machine_name(machine: &str) -> String {
    match MACHINES.iter().find(|(id, _)| *id == machine) {
        Some((id, name)) => format!("{name} ({id})"),
        None => format!("IBM Z {machine}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_known_and_unknown_machine_types() {
        assert_eq!(machine_name("2964"), "IBM z13 (2964)");
        assert_eq!(machine_name("3931"), "IBM z16 (3931)");
        assert_eq!(machine_name("1234"), "IBM Z 1234");
    }
}
