from layout_settings import *  # noqa: F403
