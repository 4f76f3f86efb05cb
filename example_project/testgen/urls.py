from django.urls import path

from . import views

app_name = "testgen"
urlpatterns = [
    path("", views.jobs_page, name="jobs"),
    path("api/jobs", views.jobs_api, name="jobs-api"),
]
