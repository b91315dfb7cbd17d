"""The services layer: every database transaction begins and ends here.

Routes and tasks call these functions with a Session; a function that
changes state commits before it returns (or raises an ApiError and leaves
nothing behind).  Routes never call commit().
"""
