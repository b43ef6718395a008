package localproxy

// NewDiscovery exposes newDiscovery to the tests.
var NewDiscovery = newDiscovery
