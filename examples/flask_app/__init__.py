"""A Flask-SQLAlchemy application with semantic search (``examples/flask_app/app.py``)."""
