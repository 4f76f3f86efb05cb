"""The runnable example: AI agents generating tests for API endpoints, made duplicate-safe.

``python3 -m example_project`` runs the demo (see :mod:`example_project.demo`);
``python -m example_project.manage runserver`` serves the job API and the jobs page.
"""
