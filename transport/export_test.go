package transport

// FailedDialHoldoff exposes failedDialHoldoff to the tests.
const FailedDialHoldoff = failedDialHoldoff
