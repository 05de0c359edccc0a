"""A FastAPI service with semantic search: ``uvicorn examples.fastapi_app.app:app``."""
