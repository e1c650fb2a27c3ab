"""`specrt serve`: a local OpenAI-compatible HTTP server (starlette + uvicorn) over one engine.

requests.py turns request bodies into sampling parameters (or OpenAI-style errors), worker.py runs one
generation at a time on the engine from a bounded queue, app.py holds the routes."""
