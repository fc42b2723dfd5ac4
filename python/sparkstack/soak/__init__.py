"""`sparkstack soak`: hours of bounded load on a served stack, logged request by request and window by window,
with /health flaps and engine restarts counted and nothing averaged away."""
