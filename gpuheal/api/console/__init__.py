"""The web console on the controller's HTTP server (docs/console.md): views from
the informer caches, autoescaping templates, sessions from the API tokens, live
updates by server-sent events."""
