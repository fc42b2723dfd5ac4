"""An OpenAI-compatible vLLM endpoint as seen from outside: one HTTP client, a careful SSE reader, /metrics
parsed into frozen samples, and the small statistics verify, bench, soak and top share."""
