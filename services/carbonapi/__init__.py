"""Carbon-signal APIs (Carbon Aware SDK, Electricity Maps) over the emulated grid."""
