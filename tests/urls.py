from django.contrib import admin
from django.urls import path

from tests.testapp import downstream_views, views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("race/<str:key>/", views.race),
    path("downstream/pay/<str:key>/", downstream_views.pay),
    path("downstream/held/<str:key>/", downstream_views.pay_held),
    path("downstream/unfenced/<str:key>/", downstream_views.pay_unfenced),
    path("downstream/class/<str:key>/", downstream_views.PayView.as_view()),
    path("downstream/decorated/<str:key>/", downstream_views.DecoratedPayView.as_view()),
]
