"""The pure decision core: signals, plans, breaker, rate limit, dedupe.

No I/O, no clock reads (time is a parameter), no Kubernetes imports: every
function here is a function of its arguments, tested exhaustively
(docs/architecture.md#functional-core-and-imperative-shell).
"""
