-- The tables the flow's triggers start runs from: applied before its migration in
-- tests/golden/test_generated_migrations.py, as an application's own migrations would be.
create table public.orders (id int primary key, status text, total numeric, customer_email text);
create schema shop;
create table shop.imported_orders (id int primary key, status text, amount numeric,
  refunded_at timestamptz);
