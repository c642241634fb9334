"""The retail domain's 15 tools, with upstream tau2-bench semantics.

Order of checks, error texts and the quirks are upstream's on purpose, because the reward
compares database states and agents read these strings. Quirks kept:

- cancel and item modification need status exactly ``pending``; address and payment
  changes accept any status containing ``pending`` (so also ``pending (item modified)``);
- ``modify_pending_order_items`` gives every modified item the price and options of the
  *last* new variant in the list, and does not round the price difference (exchanges do);
- a refund or payment that fails half-way through leaves the earlier gift-card changes made.
"""

from __future__ import annotations

import json
from typing import Any

from . import generic
from .models import GiftCard, Order, OrderPayment, Product, RetailDB, User, UserAddress, Variant
from .toolkit import READ, WRITE, Toolkit, tool

ORDER_ID = "The order id, such as '#W0000000'. Be careful there is a '#' symbol at the beginning of the order id."
USER_ID = "The user id, such as 'sara_doe_496'."
PRODUCT_ID = "The product id, such as '6086499569'. Be careful the product id is different from the item id."
PAYMENT_ID = (
    "The payment method id to pay or receive refund for the item price difference, such as "
    "'gift_card_0000000' or 'credit_card_0000000'. These can be looked up from the user or order details."
)
ADDRESS = {
    "address1": "The first line of the address, such as '123 Main St'.",
    "address2": "The second line of the address, such as 'Apt 1' or ''.",
    "city": "The city, such as 'San Francisco'.",
    "state": "The state, such as 'CA'.",
    "country": "The country, such as 'USA'.",
    "zip": "The zip code, such as '12345'.",
}
CONFIRM = "The agent needs to explain the details and ask for explicit user confirmation (yes/no) to proceed."


class RetailTools(Toolkit):
    """Tools over a :class:`RetailDB`."""

    db: RetailDB

    # ------------------------------------------------------------------ lookups

    def _get_order(self, order_id: str) -> Order:
        if order_id not in self.db.orders:
            raise ValueError("Order not found")
        return self.db.orders[order_id]

    def _get_user(self, user_id: str) -> User:
        if user_id not in self.db.users:
            raise ValueError("User not found")
        return self.db.users[user_id]

    def _get_product(self, product_id: str) -> Product:
        if product_id not in self.db.products:
            raise ValueError("Product not found")
        return self.db.products[product_id]

    def _get_item(self, item_id: str) -> Variant:
        for product in self.db.products.values():
            if item_id in product.variants:
                return product.variants[item_id]
        raise ValueError("Item not found")

    def _get_variant(self, product_id: str, variant_id: str) -> Variant:
        variants = self._get_product(product_id).variants
        if variant_id not in variants:
            raise ValueError("Variant not found")
        return variants[variant_id]

    def _get_payment_method(self, user_id: str, payment_method_id: str) -> Any:
        methods = self._get_user(user_id).payment_methods
        if payment_method_id not in methods:
            raise ValueError("Payment method not found")
        return methods[payment_method_id]

    @staticmethod
    def _check_counts(order: Order, item_ids: list[str], message: str) -> None:
        """Every id asked for is in the order at least as many times as it is asked for."""
        present = [item.item_id for item in order.items]
        for item_id in item_ids:
            if item_ids.count(item_id) > present.count(item_id):
                raise ValueError(message.format(item_id=item_id))

    @staticmethod
    def _first_item(order: Order, item_id: str):
        found = next((item for item in order.items if item.item_id == item_id), None)
        if found is None:
            raise ValueError(f"Item {item_id} not found")
        return found

    # ------------------------------------------------------------------ generic

    calculate = generic.calculate
    transfer_to_human_agents = generic.transfer_to_human_agents

    # ------------------------------------------------------------------ reads

    @tool(
        READ,
        "Find user id by email. If the user is not found, the function will return an error message.",
        {"email": "The email of the user, such as 'something@example.com'."},
    )
    def find_user_id_by_email(self, email: str) -> str:
        for user_id, user in self.db.users.items():
            if user.email.lower() == email.lower():
                return user_id
        raise ValueError("User not found")

    @tool(
        READ,
        "Find user id by first name, last name, and zip code. If the user is not found, the function will "
        "return an error message. By default, find user id by email, and only call this function if the "
        "user is not found by email or cannot remember email.",
        {
            "first_name": "The first name of the customer, such as 'John'.",
            "last_name": "The last name of the customer, such as 'Doe'.",
            "zip": "The zip code of the customer, such as '12345'.",
        },
    )
    def find_user_id_by_name_zip(self, first_name: str, last_name: str, zip: str) -> str:  # noqa: A002 - upstream name
        for user_id, user in self.db.users.items():
            if (
                user.name.first_name.lower() == first_name.lower()
                and user.name.last_name.lower() == last_name.lower()
                and user.address.zip == zip
            ):
                return user_id
        raise ValueError("User not found")

    @tool(READ, "Get the status and details of an order.", {"order_id": ORDER_ID})
    def get_order_details(self, order_id: str) -> Order:
        return self._get_order(order_id)

    @tool(READ, "Get the inventory details of a product.", {"product_id": PRODUCT_ID})
    def get_product_details(self, product_id: str) -> Product:
        return self._get_product(product_id)

    @tool(
        READ,
        "Get the inventory details of an item.",
        {"item_id": "The item id, such as '6086499569'. Be careful the item id is different from the product id."},
    )
    def get_item_details(self, item_id: str) -> Variant:
        return self._get_item(item_id)

    @tool(READ, "Get the details of a user, including their orders.", {"user_id": USER_ID})
    def get_user_details(self, user_id: str) -> User:
        return self._get_user(user_id)

    @tool(
        READ,
        "List the name and product id of all product types. Each product type has a variety of different "
        "items with unique item ids and options. There are only 50 product types in the store. Returns a "
        "JSON object mapping product names to product ids, sorted by name.",
    )
    def list_all_product_types(self) -> str:
        names = {product.name: product.product_id for product in self.db.products.values()}
        return json.dumps(names, sort_keys=True)

    # ------------------------------------------------------------------ writes

    @tool(
        WRITE,
        "Cancel a pending order. If the order is already processed or delivered, it cannot be cancelled. "
        + CONFIRM
        + " If the user confirms, the order status will be changed to 'cancelled' and the payment "
        "will be refunded. The refund will be added to the user's gift card balance immediately if the "
        "payment was made using a gift card, otherwise the refund would take 5-7 business days to process. "
        "The function returns the order details after the cancellation.",
        {
            "order_id": ORDER_ID,
            "reason": "The reason for cancellation, which should be either 'no longer needed' or 'ordered by mistake'.",
        },
    )
    def cancel_pending_order(self, order_id: str, reason: str) -> Order:
        order = self._get_order(order_id)
        if order.status != "pending":
            raise ValueError("Non-pending order cannot be cancelled")
        if reason not in {"no longer needed", "ordered by mistake"}:
            raise ValueError("Invalid reason")
        refunds = []
        for payment in order.payment_history:
            refunds.append(
                OrderPayment(
                    transaction_type="refund", amount=payment.amount, payment_method_id=payment.payment_method_id
                )
            )
            method = self._get_payment_method(self._get_user(order.user_id).user_id, payment.payment_method_id)
            if isinstance(method, GiftCard):
                method.balance = round(method.balance + payment.amount, 2)
        order.status = "cancelled"
        order.cancel_reason = reason
        order.payment_history.extend(refunds)
        return order

    @tool(
        WRITE,
        "Exchange items in a delivered order to new items of the same product type. For a delivered order, "
        "return or exchange can be only done once by the agent. " + CONFIRM,
        {
            "order_id": ORDER_ID,
            "item_ids": "The item ids to be exchanged, each such as '1008292230'. There could be duplicate items in "
            "the list.",
            "new_item_ids": "The item ids to be exchanged for, each such as '1008292230'. There could be duplicate "
            "items in the list. Each new item id should match the item id in the same position and be "
            "of the same product.",
            "payment_method_id": PAYMENT_ID,
        },
    )
    def exchange_delivered_order_items(
        self, order_id: str, item_ids: list[str], new_item_ids: list[str], payment_method_id: str
    ) -> Order:
        order = self._get_order(order_id)
        if order.status != "delivered":
            raise ValueError("Non-delivered order cannot be exchanged")
        self._check_counts(order, item_ids, "Number of {item_id} not found.")
        if len(item_ids) != len(new_item_ids):
            raise ValueError("The number of items to be exchanged should match.")
        difference = 0
        for item_id, new_item_id in zip(item_ids, new_item_ids):
            item = self._first_item(order, item_id)
            variant = self._get_variant(item.product_id, new_item_id)
            if not variant.available:
                raise ValueError(f"New item {new_item_id} not found or available")
            difference += variant.price - item.price
        difference = round(difference, 2)
        method = self._get_payment_method(order.user_id, payment_method_id)
        if isinstance(method, GiftCard) and method.balance < difference:
            raise ValueError("Insufficient gift card balance to pay for the price difference")
        order.status = "exchange requested"
        order.exchange_items = sorted(item_ids)
        order.exchange_new_items = sorted(new_item_ids)
        order.exchange_payment_method_id = payment_method_id
        order.exchange_price_difference = difference
        return order

    @tool(WRITE, "Modify the shipping address of a pending order. " + CONFIRM, {"order_id": ORDER_ID, **ADDRESS})
    def modify_pending_order_address(
        self, order_id: str, address1: str, address2: str, city: str, state: str, country: str, zip: str
    ) -> Order:  # noqa: A002 - upstream name
        order = self._get_order(order_id)
        if "pending" not in order.status:
            raise ValueError("Non-pending order cannot be modified")
        order.address = UserAddress(
            address1=address1, address2=address2, city=city, state=state, country=country, zip=zip
        )
        return order

    @tool(
        WRITE,
        "Modify items in a pending order to new items of the same product type. For a pending order, this "
        "function can only be called once. " + CONFIRM,
        {
            "order_id": ORDER_ID,
            "item_ids": "The item ids to be modified, each such as '1008292230'. There could be duplicate items in "
            "the list.",
            "new_item_ids": "The item ids to be modified for, each such as '1008292230'. There could be duplicate "
            "items in the list. Each new item id should match the item id in the same position and be "
            "of the same product.",
            "payment_method_id": PAYMENT_ID,
        },
    )
    def modify_pending_order_items(
        self, order_id: str, item_ids: list[str], new_item_ids: list[str], payment_method_id: str
    ) -> Order:
        order = self._get_order(order_id)
        if order.status != "pending":
            raise ValueError("Non-pending order cannot be modified")
        self._check_counts(order, item_ids, "{item_id} not found")
        if len(item_ids) != len(new_item_ids):
            raise ValueError("The number of items to be exchanged should match")
        difference = 0
        variant = None
        for item_id, new_item_id in zip(item_ids, new_item_ids):
            if item_id == new_item_id:
                raise ValueError("The new item id should be different from the old item id")
            item = self._first_item(order, item_id)
            variant = self._get_variant(item.product_id, new_item_id)
            if not variant.available:
                raise ValueError(f"New item {new_item_id} not found or available")
            difference += variant.price - item.price
        method = self._get_payment_method(order.user_id, payment_method_id)
        if isinstance(method, GiftCard) and method.balance < difference:
            raise ValueError("Insufficient gift card balance to pay for the new item")
        order.payment_history.append(
            OrderPayment(
                transaction_type="payment" if difference > 0 else "refund",
                amount=abs(difference),
                payment_method_id=payment_method_id,
            )
        )
        if isinstance(method, GiftCard):
            method.balance = round(method.balance - difference, 2)
        for item_id, new_item_id in zip(item_ids, new_item_ids):
            item = self._first_item(order, item_id)
            item.item_id = new_item_id
            item.price = variant.price  # the last variant of the loop above, as upstream
            item.options = variant.options
        order.status = "pending (item modified)"
        return order

    @tool(
        WRITE,
        "Modify the payment method of a pending order. " + CONFIRM,
        {"order_id": ORDER_ID, "payment_method_id": PAYMENT_ID},
    )
    def modify_pending_order_payment(self, order_id: str, payment_method_id: str) -> Order:
        order = self._get_order(order_id)
        if "pending" not in order.status:
            raise ValueError("Non-pending order cannot be modified")
        method = self._get_payment_method(order.user_id, payment_method_id)
        history = order.payment_history
        if len(history) != 1 or history[0].transaction_type != "payment":
            raise ValueError("There should be exactly one payment for a pending order")
        if history[0].payment_method_id == payment_method_id:
            raise ValueError("The new payment method should be different from the current one")
        amount = history[0].amount
        if isinstance(method, GiftCard) and method.balance < amount:
            raise ValueError("Insufficient gift card balance to pay for the order")
        old_id = history[0].payment_method_id
        history.extend(
            [
                OrderPayment(transaction_type="payment", amount=amount, payment_method_id=payment_method_id),
                OrderPayment(transaction_type="refund", amount=amount, payment_method_id=old_id),
            ]
        )
        if isinstance(method, GiftCard):
            method.balance = round(method.balance - amount, 2)
        old_method = self._get_payment_method(order.user_id, old_id)
        if isinstance(old_method, GiftCard):
            old_method.balance = round(old_method.balance + amount, 2)
        return order

    @tool(WRITE, "Modify the default address of a user. " + CONFIRM, {"user_id": USER_ID, **ADDRESS})
    def modify_user_address(
        self, user_id: str, address1: str, address2: str, city: str, state: str, country: str, zip: str
    ) -> User:  # noqa: A002 - upstream name
        user = self._get_user(user_id)
        user.address = UserAddress(
            address1=address1, address2=address2, city=city, state=state, country=country, zip=zip
        )
        return user

    @tool(
        WRITE,
        "Return some items of a delivered order. The order status will be changed to 'return requested'. "
        + CONFIRM
        + " The user will receive follow-up email for how and where to return the item.",
        {
            "order_id": ORDER_ID,
            "item_ids": "The item ids to be returned, each such as '1008292230'. There could be duplicate items in "
            "the list.",
            "payment_method_id": "The payment method id to receive the refund, such as 'gift_card_0000000' or "
            "'credit_card_0000000'. It must be the original payment method or a gift card. "
            "These can be looked up from the user or order details.",
        },
    )
    def return_delivered_order_items(self, order_id: str, item_ids: list[str], payment_method_id: str) -> Order:
        order = self._get_order(order_id)
        if order.status != "delivered":
            raise ValueError("Non-delivered order cannot be returned")
        method = self._get_payment_method(self._get_user(order.user_id).user_id, payment_method_id)
        if not isinstance(method, GiftCard) and payment_method_id != order.payment_history[0].payment_method_id:
            raise ValueError("Payment method should be the original payment method")
        self._check_counts(order, item_ids, "Some item not found")
        order.status = "return requested"
        order.return_items = sorted(item_ids)
        order.return_payment_method_id = payment_method_id
        return order
